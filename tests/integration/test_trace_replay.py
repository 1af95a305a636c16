"""A slice of Mooncake's conversation trace replayed against the real vLLM CPU server with
prefix caching on: its timing followed, its prefix blocks made into prompts the server's cache
can reuse, the ideal reuse beside the server's hits."""

from __future__ import annotations

import pytest

from orchestrator.config import to_specs
from orchestrator.trial import run_trial
from tests.conftest import engine_processes

pytestmark = pytest.mark.integration


def test_a_mooncake_slice_replays_on_time_with_its_prefix_reuse(compose, tmp_path, tiny_model_dir):
    spec, _ = to_specs(
        compose(
            [
                "+experiment=prefix_caching",
                "variant=apc_on_prefix_1024",
                "workload=mooncake",
                "workload.replay.num_requests=20",
                "++workload.replay.trace_start_s=60",
            ]
        )
    )
    lines: list[str] = []
    result = run_trial(spec, tmp_path, ["test"], progress=lines.append)
    assert result.status == "FINISHED", result.error
    (point,) = result.points
    m = point.metrics
    assert point.label == "trace_x3" and m["completed"] == 20 and m["errors"] == 0
    assert 0 < m["trace_ideal_prefix_share"] < 0.5 and m["trace_block_tokens"] == 128
    assert m["trace_requests_truncated"] >= 1  # the slice's long prompts cut to max_context_tokens
    # the server's cache reused what the trace shares, and never more (the fidelity check)
    assert m["server_prefix_cache_hit_rate"] > 0 and 0 < m["prefix_reuse_efficiency"] <= 1.6
    # the replay kept to the scaled schedule: its send lag is reported, and the point is valid
    assert "send_lag_ms_p99" in m and not point.invalid_reasons, point.invalid_reasons
    assert not engine_processes()
