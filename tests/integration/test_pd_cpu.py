"""Prefill/decode disaggregation for real on the CPU: two vLLM CPU servers (one core each) with
vLLM's ExampleConnector moving each prompt's KV through files in the trial's folder, our
proxy in front. The decode server takes the prompt's KV from the connector instead of
computing it (vLLM's own external-prefix-cache counters say so), and the trial is logged."""

from __future__ import annotations

import pytest

from orchestrator.config import to_specs
from orchestrator.trial import run_trial
from tests.conftest import engine_processes

pytestmark = pytest.mark.integration


def test_pd_through_the_example_connector_on_cpu(compose, tmp_path, tiny_model_dir):
    spec, _ = to_specs(compose([
        "engine.disaggregation={connector:ExampleConnector}", "engine.max_model_len=1024",
        # 300 tokens: not a multiple of the CPU block size (the connector keys on whole blocks of
        # the prompt minus its last token; see docs/gpu.md)
        "workload.classes={main:{input_tokens:300,output_tokens:16}}", "workload.load_points=[{concurrency:2}]",
        "workload.num_requests=6", "workload.warmup_requests=0",
    ]))
    lines: list[str] = []
    result = run_trial(spec, tmp_path, ["test"], progress=lines.append)
    assert result.status == "FINISHED", result.error
    m = result.points[0].metrics
    assert m["completed"] == 6 and m["errors"] == 0 and m["output_tokens"] == 6 * 16
    # the decode server (the one scraped) loaded the prompts' KV from the connector
    assert m["server_external_prefix_cache_queries"] >= 6 * 256
    assert m["server_external_prefix_cache_hits"] >= 6 * 256, m
    stored = list((tmp_path / "kv_store").glob("*/*.safetensors"))
    assert len(stored) >= 6, "the prefill server wrote no KV files"
    assert not engine_processes()
