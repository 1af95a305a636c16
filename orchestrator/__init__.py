"""Inference-lab orchestrator: sweeps of LLM serving configurations, run on Ray, tracked in MLflow."""

__version__ = "0.1.0"
