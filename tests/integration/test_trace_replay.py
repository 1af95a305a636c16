"""A slice of Mooncake's conversation trace replayed against the real vLLM CPU server with
prefix caching on: its timing followed, its prefix blocks made into prompts the server's cache
can reuse, the ideal reuse beside the server's hits. Then, on the same server, a Bailian-style
multi-turn file: every follower after its parent's reply, the reply in its prompt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.config import to_specs
from orchestrator.config.schema import LoadPointSpec
from orchestrator.metrics.records import parquet_bytes_to_table, table_to_records
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
                "workload.replay.num_requests=20",  # at the workload's sixth of the trace's speed
            ]
        )
    )
    bailian = LoadPointSpec(trace=str(Path(__file__).parents[1] / "data" / "bailian_sample.jsonl"))
    workload = spec.workload.model_copy(update={"load_points": [*spec.workload.load_points, bailian]})
    spec = spec.model_copy(update={"workload": workload})
    lines: list[str] = []
    result = run_trial(spec, tmp_path, ["test"], progress=lines.append)
    assert result.status == "FINISHED", result.error
    point, chats = result.points
    m = point.metrics
    assert point.label == "trace_x6" and m["completed"] == 20 and m["errors"] == 0
    assert 0 < m["trace_ideal_prefix_share"] < 0.5 and m["trace_block_tokens"] == 128
    assert m["trace_requests_truncated"] >= 1  # the slice's long prompts cut to max_context_tokens
    # the server's cache reused what the trace shares, and no more than its blocks allow: the
    # fidelity check's bound, the ideal share plus workload.fidelity.max_unexpected_hit_rate (the
    # point is INVALID past it, below), within which hits are not told from the ideal's
    hits, ideal = m["server_prefix_cache_hit_rate"], m["trace_ideal_prefix_share"]
    assert 0 < hits <= ideal + spec.workload.fidelity.max_unexpected_hit_rate, (hits, ideal)
    assert m["prefix_reuse_efficiency"] == pytest.approx(hits / ideal)
    # the replay kept to the scaled schedule, or says it did not: the point is valid, or INVALID for
    # its send lag alone, the p95 of the records' own lags (how late each send went out)
    everything = table_to_records(parquet_bytes_to_table(result.records_parquet))
    first = min(r.intended_send_s for r in everything if r.point == 0)
    lags = [  # (the instant in the trace, ms late) for each send: what to read when this fails
        (round(r.intended_send_s - first, 2), round((r.sent_s - r.intended_send_s) * 1e3, 1))
        for r in sorted(everything, key=lambda r: (r.intended_send_s, r.sent_s))
        if r.point == 0
    ]
    client = {k: round(v, 1) for k, v in m.items() if k.startswith(("loop_lag_ms", "client_start_late"))}
    p95 = float(np.percentile([(r.sent_s - r.intended_send_s) * 1e3 for r in everything if r.point == 0], 95))
    assert m["send_lag_ms_p95"] == pytest.approx(p95, abs=0.01), (m["send_lag_ms_p95"], p95)
    bound = spec.workload.validity.max_send_lag_ms_p95
    reasons = point.invalid_reasons
    if p95 > bound:  # late: flagged, for that reason only, with the records' number
        assert len(reasons) == 1 and reasons[0].startswith(f"send lag p95 {p95:.1f} ms > {bound:g}"), reasons
        assert m["client_invalid"] == 1.0 and m["workload_invalid"] == 0.0, (reasons, lags, client)
    else:
        assert not reasons and m["invalid"] == 0.0, (reasons, lags, client)
    assert m["ttft_from_schedule_ms_p50"] >= m["ttft_ms_p50"]
    # the multi-turn file: 2 conversations, 6 requests; a follower after its parent's reply
    assert chats.metrics["completed"] == 6 and chats.metrics["trace_conversations"] == 2
    recs = [r for r in everything if r.point == 1]
    by_turn = {(r.conversation_id, r.turn): r for r in recs}
    for r in recs:
        if r.turn:
            parents = [p for p in recs if p.conversation_id == r.conversation_id and p.turn == r.turn - 1]
            assert any(p.done_s <= r.sent_s for p in parents)
            # its prompt (server-counted) holds the parent's prompt and reply
            assert r.prompt_tokens > min(p.prompt_tokens + p.output_tokens for p in parents)
    assert len(by_turn) == 5  # (conv 1: turns 0, 1, 2; conv 4: turns 0, 1), one turn-1 branch twice
    assert not engine_processes()
