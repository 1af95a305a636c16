"""SLO capacity search on the real vLLM CPU server, and the sweep's verdict over it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, engine_processes, search_runs

pytestmark = pytest.mark.integration


@pytest.mark.long  # in CI another way: the search's path against a scripted latency curve
# (unit/test_trial_external.py), its decisions (unit/test_capacity.py), verdicts on capacity (unit/test_report.py, unit/test_race.py)
def test_capacity_of_two_chunked_prefill_budgets_and_the_verdict(tmp_path):
    # Two budgets under an ITL p99 SLO on the short streams, long prompts arriving meanwhile:
    # each trial searches its own server's capacity (in streams); the verdict names the one
    # that sustains more. Few requests per probe: this checks the path, not the lab's numbers.
    store = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "+experiment=chunked_prefill",
        "variant=budget_256,budget_2048",
        "per_platform.cpu.workload.load_points=[]",
        "per_platform.cpu.workload.num_requests=8",
        "workload.capacity={knob:concurrency,start:2,high:8,max_probes:3,slo:{short/itl_ms_p99:450}}",
        "~objective",
        "+objective={maximize:slo_capacity_concurrency,show:[short/itl_ms_p99],max_repeats:1}",  # no race here
        f"tracking.uri={store}",
        f"hydra.sweep.dir={tmp_path}/multirun",
        "-m",
    ]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout
    assert "probe 1 c2: running" in out and "SLO capacity: capacity" in out
    runs = search_runs(store, "chunked_prefill")
    trials = {r.data.tags["variant"]: r for r in runs if r.data.tags.get("run_kind") == "trial"}
    assert set(trials) == {"budget_256", "budget_2048"}
    caps = {}
    for v, r in trials.items():
        m = r.data.metrics
        assert r.data.tags["trial_status"] == "FINISHED"
        assert 1 <= m["slo_capacity_concurrency_probes"] <= 3
        if m["slo_capacity_concurrency_undecided"] == 1.0:  # every probe INVALID (2 busy cores): no capacity, not 0
            assert "slo_capacity_concurrency" not in m
            assert r.data.tags["slo_capacity"].startswith("capacity not measured: no probe decided anything")
            continue
        assert m["slo_capacity_concurrency"] in (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)
        assert r.data.tags["slo_capacity"].startswith("capacity ")
        caps[v] = m["slo_capacity_concurrency"]
    parent = next(r for r in runs if r.data.tags.get("run_kind") == "sweep")
    if not caps:
        assert parent.data.tags["verdict"] == "none"
    elif len(set(caps.values())) == 1:  # a tie, or only one trial measured: it is the verdict's
        assert parent.data.tags["verdict"] in caps
    else:
        best = max(caps, key=lambda v: (caps[v], v == "budget_256"))  # the verdict keeps sweep order on ties
        assert parent.data.tags["verdict"] == best
    # "objective: maximize ..." after a best, "no trial meets the objective (maximize ...)" without one
    assert "maximize slo_capacity_concurrency" in parent.data.tags["verdict_text"]
    assert "Verdict: " in out
    summary = next((tmp_path / "multirun").glob("*/report/summary.md"), None) or next(
        (tmp_path / "multirun").glob("**/summary.md")
    )
    assert "**Verdict:**" in summary.read_text()
    timelines = sorted(summary.parent.glob("timelines/*.png"))  # each trial's timeline, in the report
    assert [t.name.split("-")[0] for t in timelines] == ["budget_2048", "budget_256"]
    assert all(t.stat().st_size > 20_000 for t in timelines) and "## Timelines" in summary.read_text()
    assert not engine_processes()
