"""The diagnosis end to end (a trial against the fake server, engine=external with vLLM's
metrics) on known causes: the fake's engine scripted to queue for slots or KV, to stall every
stream while a long prompt is prefilled, to preempt, to pause, or to fall behind an open loop.
Each must name the right cause and no wrong strong one."""

from __future__ import annotations

import pytest

from orchestrator.config import to_specs
from orchestrator.metrics.result import load_result
from orchestrator.trial import run_trial
from testkit.fake_engine_model import EngineScript
from testkit.fake_openai_server import IsolatedFakeServer, Script

pytestmark = pytest.mark.measures

MAIN = ["workload.classes={main:{input_tokens:64,output_tokens:32}}"]
MIXED = [
    "workload=mixed_long_short",
    "workload.classes.short.input_tokens=64",
    "workload.classes.short.output_tokens=32",
    "workload.classes.long.input_tokens=1024",
    "workload.classes.long.output_tokens=2",
    "workload.classes.long.rate=2",
    "+workload.classes.long.arrival=constant",
]
CASES = {
    "headroom": (dict(), {}, [*MAIN, "workload.load_points=[{concurrency:1}]", "workload.num_requests=4"], "none"),
    "slots": (dict(slots=2), {}, [*MAIN, "workload.load_points=[{concurrency:5}]"], "batch_slots"),
    "kv": (dict(), dict(kv_tokens=200), [*MAIN, "workload.load_points=[{concurrency:5}]"], "kv_capacity"),
    "preempt": (dict(), dict(preempt_every=2), [*MAIN, "workload.load_points=[{concurrency:3}]"], "kv_capacity"),
    "prefill": (
        dict(),
        dict(prefill_s_per_token=0.0003, prefill_min_tokens=500),
        [*MIXED, "workload.load_points=[{concurrency:3}]", "workload.num_requests=12"],
        "prefill_interference",
    ),
    "over": (
        dict(slots=2),
        {},
        [*MAIN, "workload.load_points=[{rate:10}]", "workload.num_requests=24"],
        "over_capacity",
    ),
    "pause": (dict(), dict(pauses=((0.5, 0.3),)), [*MAIN, "workload.load_points=[{concurrency:3}]"], "none"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_scripted_cause_is_named(case, compose, tmp_path, tiny_model_dir):
    server, engine, overrides, expected = CASES[case]
    script = Script(ttft_s=0.01, itl_s=0.02, tokenizer=str(tiny_model_dir), engine=EngineScript(**engine), **server)
    with IsolatedFakeServer(script) as srv:
        spec, _ = to_specs(
            compose(
                [
                    "engine=external",
                    f"engine.url={srv.base_url}",
                    "engine.metrics=vllm",
                    f"model.tokenizer={tiny_model_dir}",
                    "workload.num_requests=10",
                    "workload.warmup_requests=0",
                    "platform.monitor_interval_s=0.2",
                    *overrides,
                ]
            )
        )
        lines: list[str] = []
        result = run_trial(spec, tmp_path, progress=lines.append)
    assert result.status == "FINISHED", result.error
    point = result.points[0]
    d = point.diagnosis
    # On two cores the client shares them with the fake server: now and then it is starved (send
    # lag, loop lag; a CI run of the vLLM test: send lag p95 248 ms). Such a point is INVALID and
    # its diagnosis names the client first, with the validity check's own reasons; the scripted
    # cause must still be found beside it.
    starved = d["limiter"] == "client"
    if starved:
        said = d["findings"][0]["detail"].split("; ")
        assert said and all(r in point.invalid_reasons for r in said), (point.invalid_reasons, d["text"])
        assert expected == "none" or any(f["cause"] == expected for f in d["findings"]), d["text"]
    else:
        assert d["limiter"] == expected, d["text"]
    allowed = {expected, "client"} if starved else {expected}
    wrong = [f for f in d["findings"] if f["confidence"] == "strong" and f["cause"] not in allowed]
    assert not wrong, d["text"]
    assert any(d["headline"] in line for line in lines)  # the console line at the end of the point
    m = result.points[0].metrics
    if case == "preempt":
        assert m["stalls_preemption"] >= 1 and m["stalls_prefill"] == 0
    if case == "prefill":
        assert m["stalls_prefill"] >= 3 and d["stalls"][0]["by_prompt_tokens"] >= 1024
    if case == "pause":
        assert m["stalls_unattributed"] >= 1 and "matched no cause" in d["text"]
    if case in ("slots", "kv"):
        assert m["ttft_parts_queue_ms"] > m["ttft_parts_prefill_ms"]
    assert load_result(tmp_path).points[0].diagnosis == d  # on disk, as logged
