"""The lever table's moves as the trials they make: each default row that applies to an engine
on a platform, proposed from a baseline where every knob it moves is set, as the overrides a
tuner's candidate gets (for the engines' parsers: tests/unit/test_vllm_args.py on vLLM's CPU
build, tests/engines/test_gpu_builds.py on the pinned GPU builds)."""

from __future__ import annotations

from collections.abc import Iterator

from orchestrator.metrics.diagnosis import Evidence
from orchestrator.tuning.candidates import hydra_value
from orchestrator.tuning.levers import load_levers
from orchestrator.tuning.moves import MODEL_KNOB, Start, propose
from orchestrator.tuning.space import Space

# a baseline in which every knob a lever steps from is set (a relative move needs a value)
BASELINES = {
    "vllm": {
        "engine.max_num_seqs": 64,
        "engine.max_num_batched_tokens": 2048,
        "engine.enable_chunked_prefill": True,
        "engine.gpu_memory_utilization": 0.85,
        "engine.cpu_kvcache_space_gib": 4,
        "engine.max_model_len": 4096,
        "engine.tensor_parallel_size": 1,
    },
    "sglang": {
        "engine.max_running_requests": 64,
        "engine.chunked_prefill_size": 2048,
        "engine.tensor_parallel_size": 1,
        "engine.disable_radix_cache": True,
    },
}
MODELS = {"gpu": "meta-llama/Llama-3.1-8B-Instruct", "cpu": "tiny-llama"}  # each platform's default model
# what the findings a move reads saw: batch slots' demand, prefill interference's stall cost
SEEN = Evidence(running_max=64.0, waiting_max=64.0, decode_step_ms=10.0, prefill_stall_ms_per_token=0.05)


def lever_overrides(engine: str, platform: str) -> Iterator[tuple[str, list[str]]]:
    """(cause/lever, overrides) of every default lever that applies to ``engine`` on ``platform``."""
    base = {**BASELINES[engine], MODEL_KNOB: MODELS[platform]}
    for cause, levers in load_levers().items():
        for lever in levers:
            # the objective constrains accuracy: the rows that change the model's numbers apply
            p = propose(cause, lever, Start(base, Space.of(None), engine, platform, guards_accuracy=True), SEEN)
            if p.skip:
                continue
            knobs = {**base, **p.values}
            overrides = [f"engine={engine}", f"platform={platform}"] + [
                f"++{k}={hydra_value(v)}" for k, v in knobs.items() if k != MODEL_KNOB
            ]
            yield f"{cause}/{lever.name}", overrides
