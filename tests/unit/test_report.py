"""Reports: lab plots and the summary table, from results and rebuilt from MLflow alone."""

from __future__ import annotations

import math
import time

import pytest

from orchestrator.decide.trials import Point, TrialData
from orchestrator.metrics.records import RequestRecord, records_to_parquet_bytes
from orchestrator.metrics.result import PointResult, TrialResult
from orchestrator.report import best_configuration, build_report, from_mlflow, from_results
from orchestrator.report.figures import knee, pareto


def _result(variant, engine, points, metrics=None, records=b"", workload=None):
    now = time.time()
    return TrialResult(
        trial_hash=(variant * 8)[:16].ljust(16, "0"),
        experiment="x",
        variant=variant,
        spec={"engine": engine, "workload": workload or {"name": "w"}},
        status="FINISHED",
        started_at=now,
        ended_at=now,
        points=points,
        metrics=metrics or {},
        records_parquet=records,
    )


def _point(i, setting, diagnosis=None, **m):
    classes = {k.split("/")[0]: {} for k in m if "/" in k}
    for k, v in m.items():
        if "/" in k:
            classes[k.split("/")[0]][k.split("/")[1]] = v
    return PointResult(
        index=i,
        label=f"p{i}",
        setting=setting,
        metrics={k: v for k, v in m.items() if "/" not in k},
        class_metrics=classes,
        diagnosis=diagnosis or {},
    )


def _diagnosis(limiter, detail):
    return {
        "limiter": limiter,
        "confidence": "strong",
        "headline": f"limited by {limiter.replace('_', ' ')} (strong): {detail}",
        "findings": [{"cause": limiter, "confidence": "strong", "detail": detail, "evidence": {}}],
        "stalls": [{"t": 1.2, "gap_ms": 700.0, "cause": "prefill"}],
    }


def _records(point, long_at):
    recs, rid = [], 0
    for _ in range(4):  # short streams with one stall per long prompt
        times = [1.0 + 0.05 * k for k in range(60)]
        recs.append(RequestRecord(rid, point, "short", 1.0, 1.0, 128, 64, times, [1] * 60, 4.0))
        rid += 1
    for t in long_at:
        recs.append(RequestRecord(rid, point, "long", t, t, 1024, 4, [t + 0.7], [1], t + 0.8))
        rid += 1
    return records_to_parquet_bytes(recs)


@pytest.fixture
def chunked_results():
    out = []
    for variant, chunked, budget, itl in [
        ("chunking_off", False, None, 700.0),
        ("budget_256", True, 256, 210.0),
        ("budget_2048", True, 2048, 730.0),
    ]:
        pts = [
            _point(
                i,
                {"concurrency": c},
                _diagnosis("prefill_interference", f"worst {itl:.0f} ms"),
                ttft_ms_p50=100.0,
                itl_ms_p99=itl,
                tokens_per_second=200.0 + i,
                **{"short/itl_ms_p99": itl * (1 + i), "long/ttft_ms_p99": 900.0 - (budget or 0) / 10},
            )
            for i, c in enumerate([2, 4])
        ]
        out.append(
            _result(
                variant,
                {"enable_chunked_prefill": chunked, "max_num_batched_tokens": budget},
                pts,
                {"memory_peak_gb_max": 4.8},
                _records(1, [1.5, 2.7]),
            )
        )
    return out


def test_chunked_prefill_report_from_results(chunked_results, tmp_path):
    data = from_results(chunked_results, "chunked_prefill")
    files = build_report(data, tmp_path)
    names = [f.name for f in files]
    assert names == ["chunked_prefill_budget.png", "chunked_prefill_itl_over_time.png", "overview.png", "summary.md"]
    for f in files[:-1]:
        assert f.stat().st_size > 10_000 and f.read_bytes()[:4] == b"\x89PNG"
    md = (tmp_path / "summary.md").read_text()
    assert "engine.max_num_batched_tokens" in md and "engine.enable_chunked_prefill" in md  # the varied knobs
    assert md.count("| budget_256 | FINISHED |") == 2  # one row per load point
    assert "![chunked_prefill_budget.png](chunked_prefill_budget.png)" in md
    assert "**Best configuration:** chunking_off" in md  # all tie on tok/s: the first of the maxima


def test_summary_says_how_the_load_was_generated(tmp_path):
    workload = {
        "name": "w",
        "classes": {
            "main": {"dataset": "vllm_random"},
            "bg": {"dataset": "random", "rate": 0.8, "arrival": "constant"},
        },
    }
    pts = [
        _point(0, {"concurrency": 8}),
        _point(1, {"rate": 2.0, "arrival": "poisson", "burstiness": 1.0, "max_concurrency": 16}),
    ]
    build_report(from_results([_result("a", {}, pts, workload=workload)], "x"), tmp_path)
    md = (tmp_path / "summary.md").read_text()
    assert "closed loops: N streams, each sending its next request the moment its previous one completes" in md
    assert "poisson arrivals at X req/s" in md and "at most 16 in flight" in md
    assert "Prompts of class `main`: vllm_random: runs of consecutive token ids" in md
    assert "Prompts of class `bg`: random: uniformly random token ids" in md
    assert "Class `bg` is background traffic: constant arrivals at 0.8 req/s during every point" in md


def test_report_rebuilt_from_mlflow_alone(chunked_results, tmp_path):
    from orchestrator.tracking import MlflowTracker

    uri = f"sqlite:///{tmp_path}/m.db"
    tracker = MlflowTracker(uri, "chunked_prefill")
    sweep = tracker.start_sweep("s", {}, {})
    for r in chunked_results:
        d = tmp_path / r.variant
        from orchestrator.metrics.result import save_result

        save_result(r, d)
        (d / "timeline.png").write_bytes(b"\x89PNG timeline of " + r.variant.encode())
        tracker.log_trial(r, d)
    tracker.end_sweep({"FINISHED": 3})
    data = from_mlflow(uri, "chunked_prefill")
    assert data.sweep_run_id == sweep and len(data.trials) == 3
    by = {t.name: t for t in data.trials}
    assert by["budget_256"].points[1].metrics["short/itl_ms_p99"] == 420.0  # class metrics via points.csv
    assert by["chunking_off"].param("engine.enable_chunked_prefill") == "False"
    assert by["budget_256"].records().num_rows == 6
    files = build_report(data, tmp_path / "rebuilt")
    assert [f.name for f in files][:2] == ["chunked_prefill_budget.png", "chunked_prefill_itl_over_time.png"]
    timeline = tmp_path / "rebuilt" / "timelines" / f"budget_256-{by['budget_256'].trial_hash[:8]}.png"
    assert timeline in files and timeline.read_bytes() == b"\x89PNG timeline of budget_256"  # the run's own
    summary = (tmp_path / "rebuilt" / "summary.md").read_text()
    assert f"- budget_256: [timelines/{timeline.name}](timelines/{timeline.name})" in summary
    # what limited each point travels through points.csv (without the stalls) and the run's tags
    p = by["budget_256"].points[1]
    assert p.limiter == "prefill_interference" and not p.diagnosis.stalls
    assert "| budget_256 | p1 | prefill interference | strong | worst 210 ms |  |" in summary
    from mlflow.tracking import MlflowClient

    tags = MlflowClient(uri).get_run(by["budget_256"].run_id).data.tags
    assert tags["limiter"] == "prefill_interference"
    assert tags["diagnosis"].startswith("p0: limited by prefill interference (strong): worst 210 ms | p1:")
    with pytest.raises(LookupError, match="no MLflow experiment 'nope'.*chunked_prefill"):
        from_mlflow(uri, "nope")


def test_report_cli_rebuilds_and_logs_to_the_sweep_run(chunked_results, tmp_path):
    from mlflow.tracking import MlflowClient

    from orchestrator.report.__main__ import main
    from orchestrator.tracking import MlflowTracker

    uri = f"sqlite:///{tmp_path}/m.db"
    tracker = MlflowTracker(uri, "chunked_prefill")
    sweep = tracker.start_sweep("s", {}, {})
    (tmp_path / "timeline.png").write_bytes(b"\x89PNG")
    tracker.log_trial(chunked_results[0], tmp_path)
    tracker.end_sweep({"FINISHED": 1})
    assert main(["experiment=chunked_prefill", f"tracking.uri={uri}", f"out={tmp_path}/r", "log=true"]) == 0
    logged = {a.path for a in MlflowClient(uri).list_artifacts(sweep, "report")}
    assert "report/summary.md" in logged and "report/chunked_prefill_budget.png" in logged
    assert "report/timelines" in logged  # the report's subfolder is kept on the run
    timelines = [a.path for a in MlflowClient(uri).list_artifacts(sweep, "report/timelines")]
    assert timelines == [f"report/timelines/{chunked_results[0].variant}-{chunked_results[0].trial_hash[:8]}.png"]
    assert main(["experiment=missing", f"tracking.uri={uri}"]) == 2


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["chunked_prefill"], "expected key=value"),
        (["experiment=x", "delta=abc"], "delta: expected a number"),
        (["experiment=x", "tracking.uri=sqlite:///{tmp}/none/m.db"], "tracking.uri: no MLflow store at"),
        (["experiment=x", "tracking.uri=foo://bar"], "tracking.uri=foo://bar: "),
    ],
)
def test_report_cli_mistakes_are_one_line_and_exit_2(tmp_path, capsys, args, said):
    """A mistake in the report command's arguments is a line naming the key, exit code 2 (an
    unknown URI scheme was MLflow's traceback); reading never creates a store where none was."""
    from orchestrator.report.__main__ import main

    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    try:
        code = main(args)
    except SystemExit as exc:
        code = exc.code
    assert code == 2 and said in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_first_serving_knee_and_plot(tmp_path):
    pts = [
        _point(
            0,
            {"rate": 1.0},
            ttft_ms_p50=150.0,
            ttft_ms_p99=240.0,
            itl_ms_p50=10.0,
            itl_ms_p99=25.0,
            qps=0.84,
            schedule_rate=0.82,
            tokens_per_second=50.0,
        ),
        _point(
            1,
            {"rate": 4.0},
            ttft_ms_p50=240.0,
            ttft_ms_p99=890.0,
            itl_ms_p50=16.0,
            itl_ms_p99=270.0,
            qps=3.2,
            schedule_rate=3.96,
            tokens_per_second=214.0,
        ),
        _point(
            2,
            {"rate": math.inf},
            ttft_ms_p50=3270.0,
            ttft_ms_p99=4690.0,
            itl_ms_p50=38.0,
            itl_ms_p99=1190.0,
            qps=4.2,
            tokens_per_second=277.0,
        ),
    ]
    data = from_results([_result("vllm", {}, pts)], "first_serving")
    assert knee(data.trials[0]).label == "p2"  # not the finite sweep's tail at rate 4
    files = build_report(data, tmp_path)
    assert files[0].name == "first_serving.png"


def test_best_configuration_respects_accuracy():
    def trial(name, tps, acc=None):
        metrics = {"accuracy": acc} if acc is not None else {}
        return TrialData(name, "FINISHED", {}, metrics, [Point(0, "p0", {}, {"tokens_per_second": tps})])

    trials = [trial("bf16", 100, 0.80), trial("fp8", 150, 0.795), trial("int4", 200, 0.70)]
    best, why = best_configuration(trials, delta=0.01)
    assert best.name == "fp8" and "accuracy >= 0.790" in why
    assert best_configuration(trials, delta=0.2)[0].name == "int4"
    assert best_configuration([trial("a", 1), trial("b", 2)])[0].name == "b"


def test_pareto_front():
    pts = [(4.0, 100.0, "a"), (2.0, 90.0, "b"), (3.0, 80.0, "c"), (5.0, 120.0, "d")]
    assert [p[2] for p in pareto(pts)] == ["b", "a", "d"]


def _trial(name, budget, points, metrics=None):
    params = {"engine.max_num_batched_tokens": str(budget), "engine.enable_chunked_prefill": str(budget is not None)}
    return TrialData(name, "FINISHED", params, metrics or {}, points)


def test_verdict_smallest_budget_within_the_long_prompt_slo(tmp_path):
    from orchestrator.config.schema import ObjectiveSpec
    from orchestrator.decide.trials import SweepData
    from orchestrator.decide.verdict import decide

    objective = ObjectiveSpec.model_validate(
        {
            "minimize": "engine.max_num_batched_tokens",
            "subject_to": {"long/ttft_ms_p99": 2000},
            "show": ["short/itl_ms_p99"],
            "frontier": {"minimize": "short/itl_ms_p99", "maximize": "tokens_per_second"},
        }
    )

    def pts(ttft, itl, tps):
        return [
            Point(0, "c2", {"concurrency": 2}, {}),
            Point(
                1,
                "c4",
                {"concurrency": 4},
                {"long/ttft_ms_p99": ttft, "short/itl_ms_p99": itl, "tokens_per_second": tps},
            ),
        ]

    trials = [
        _trial("chunking_off", None, pts(900, 737, 300)),
        _trial("budget_128", 128, pts(2600, 150, 280)),
        _trial("budget_256", 256, pts(1400, 212, 310)),
        _trial("budget_2048", 2048, pts(1085, 700, 305)),
    ]
    v = decide(trials, objective)
    assert v.best.name == "budget_256"
    assert v.headline.startswith(
        "**Verdict:** budget_256: engine.max_num_batched_tokens 256 (long/ttft_ms_p99 1400, short/itl_ms_p99 212)"
    )
    excluded = dict((t.name, why) for t, why in v.excluded)
    assert excluded == {
        "chunking_off": "engine.max_num_batched_tokens not set",
        "budget_128": "long/ttft_ms_p99 2600, needs <= 2000",
    }
    data = SweepData("chunked_prefill", trials, "results", objective=objective)
    files = build_report(data, tmp_path)
    assert "frontier.png" in [f.name for f in files]
    md = (tmp_path / "summary.md").read_text()
    assert "**Verdict:** budget_256" in md and "Best configuration" not in md
    assert "What `engine.enable_chunked_prefill` changed:" in md
    assert "| 256 | budget_256 | 1400 | 212 |" in md and "| True | budget_256 | 1400 | 212 |" in md


def test_verdict_calls_overlapping_intervals_a_tie_and_checks_accuracy_against_the_baseline():
    from orchestrator.config.schema import ObjectiveSpec
    from orchestrator.decide.verdict import decide

    objective = ObjectiveSpec.model_validate({"maximize": "slo_capacity_rps", "subject_to": {"accuracy": "base-0.01"}})
    trials = [
        _trial("fp16", None, [], {"slo_capacity_rps": 10.0, "slo_capacity_rps_ci95": 1.0, "accuracy": 0.80}),
        _trial("fp8", None, [], {"slo_capacity_rps": 10.8, "slo_capacity_rps_ci95": 0.5, "accuracy": 0.795}),
        _trial("int4", None, [], {"slo_capacity_rps": 14.0, "slo_capacity_rps_ci95": 0.5, "accuracy": 0.70}),
    ]
    v = decide(trials, objective)
    assert v.best.name == "fp8" and [t.name for t in v.ties] == ["fp16"]
    assert "Tied within the 95% intervals: fp16 (10 ± 1)" in v.headline
    assert dict((t.name, why) for t, why in v.excluded) == {"int4": "accuracy 0.7, needs >= 0.79"}
    none = decide(
        trials, ObjectiveSpec.model_validate({"maximize": "slo_capacity_rps", "subject_to": {"accuracy": {"min": 0.9}}})
    )
    assert none.best is None and none.headline.startswith("**Verdict:** no trial meets the objective")


def test_objective_config_errors_name_the_key():
    from pydantic import ValidationError

    from orchestrator.config.schema import ObjectiveSpec

    with pytest.raises(ValidationError, match="exactly one of maximize / minimize"):
        ObjectiveSpec.model_validate({"maximize": "a", "minimize": "b"})
    with pytest.raises(ValidationError, match="objective.subject_to.accuracy: expected a number"):
        ObjectiveSpec.model_validate({"maximize": "a", "subject_to": {"accuracy": "baseline"}})


def test_the_labs_claims_are_checked_in_the_report_and_read_back_from_mlflow(chunked_results, tmp_path):
    from orchestrator.config.schema import ExpectationSpec
    from orchestrator.metrics.result import save_result
    from orchestrator.tracking import MlflowTracker

    claims = [
        ExpectationSpec.model_validate(
            {
                "claim": "chunking cuts the spikes",
                "metric": "short/itl_ms_p99",
                "lower": "budget_256",
                "than": "chunking_off",
            }
        ),
        ExpectationSpec.model_validate({"claim": "stalls", "limiter": "prefill_interference", "in": "chunking_off"}),
        ExpectationSpec.model_validate({"claim": "graphs", "metric": "startup_s", "above": 1, "needs": "gpu"}),
    ]
    for r in chunked_results:
        r.spec["platform"] = {"name": "cpu"}
    data = from_results(chunked_results, "chunked_prefill", expect=claims)
    out = tmp_path / "report"
    files = build_report(data, out)
    md = (out / "summary.md").read_text()
    assert "Expectations: 2 observed, 0 not observed, 1 not measurable here (of 3)." in md
    assert "- [observed] chunking cuts the spikes (short/itl_ms_p99 at heaviest" not in md
    assert "- [observed] chunking cuts the spikes (short/itl_ms_p99: budget_256 420 < chunking_off 1400)" in md
    assert "- [not measurable here] graphs (needs a GPU; this sweep ran on cpu)" in md
    uri = f"sqlite:///{tmp_path}/m.db"
    tracker = MlflowTracker(uri, "chunked_prefill")
    tracker.start_sweep("s", {}, {})
    for r in chunked_results:
        d = save_result(r, tmp_path / r.variant)
        tracker.log_trial(r, d)
    tracker.log_sweep_files(files, "report", root=out)
    back = from_mlflow(uri, "chunked_prefill")
    assert [e.claim for e in back.expect] == [e.claim for e in claims] and back.expect[1].in_ == ["chunking_off"]


def test_the_frontier_leaves_out_invalid_points_and_draws_intervals(tmp_path):
    """A value read at an INVALID point is drawn hollow and is not on the Pareto frontier; a
    race's interval between runs is drawn as error bars."""
    from orchestrator.decide.objective import Value
    from orchestrator.decide.trials import SweepData
    from orchestrator.report.figures import frontier, frontier_set

    good, bad, slow = Value(100.0, 5.0, "c4", 3), Value(50.0, None, "c4"), Value(300.0, None, "c4")
    pts = [(good, Value(200.0, 10.0, "c4", 3), "a", False), (bad, Value(400.0, None, "c4"), "b", True)]
    assert [name for *_, name in frontier_set(pts)] == ["a"]  # b would dominate, but it was INVALID
    pts.append((slow, Value(250.0, None, "c4"), "c", False))
    assert [name for *_, name in frontier_set(pts)] == ["a", "c"]
    ok = Point(0, "c4", {"concurrency": 4}, {})
    invalid = Point(0, "c4", {"concurrency": 4}, {"invalid": 1.0})
    trials = [_trial("a", 1, [ok]), _trial("b", 2, [invalid]), _trial("c", 3, [ok])]
    values = {("a", "x"): pts[0][0], ("a", "y"): pts[0][1], ("b", "x"): bad, ("b", "y"): pts[1][1]}
    values |= {("c", "x"): slow, ("c", "y"): pts[2][1]}
    files = frontier(SweepData("e", trials, "results"), tmp_path, "x", "y", lambda t, k: values[(t.name, k)])
    assert [f.name for f in files] == ["frontier.png"] and files[0].stat().st_size > 1000


def test_a_constraint_judged_at_an_invalid_point_is_flagged_whatever_the_objective():
    from orchestrator.config.schema import ObjectiveSpec
    from orchestrator.decide.verdict import decide

    objective = ObjectiveSpec(minimize="engine.max_num_batched_tokens", subject_to={"long/ttft_ms_p99": 2000})
    ok = Point(0, "c4", {"concurrency": 4}, {"long/ttft_ms_p99": 900.0})
    bad = Point(0, "c4", {"concurrency": 4}, {"long/ttft_ms_p99": 800.0, "invalid": 1.0})
    v = decide([_trial("b256", 256, [bad]), _trial("b512", 512, [ok])], objective)
    assert v.best.name == "b256"  # a knob objective: its own value is never read at a point
    assert any("constraint of b256 (long/ttft_ms_p99) was judged at a load point flagged INVALID" in x for x in v.lines)


def test_a_value_read_at_an_invalid_point_of_a_later_run_is_flagged():
    """A race's later run whose point was INVALID (its client fell behind) is part of the value
    the verdict compares: the verdict says so, as for the first run."""
    from orchestrator.config.schema import ObjectiveSpec
    from orchestrator.decide.verdict import decide

    objective = ObjectiveSpec(maximize="tokens_per_second")
    ok = Point(0, "c4", {"concurrency": 4}, {"tokens_per_second": 100.0})
    bad = Point(0, "c4", {"concurrency": 4}, {"tokens_per_second": 104.0, "invalid": 1.0})
    a, b = _trial("a", 256, [ok]), _trial("b", 512, [ok])
    a.runs, b.runs = [_trial("a-run1", 256, [ok])], [_trial("b-run1", 512, [bad])]
    v = decide([a, b], objective)
    assert any(x.startswith("Caution: the value of b was read at a load point flagged INVALID") for x in v.lines)
    assert not any("value of a" in x for x in v.lines)


def test_the_chunked_prefill_plot_draws_the_race_between_runs(tmp_path):
    from orchestrator.decide.trials import SweepData
    from orchestrator.report.figures import point_between_runs
    from orchestrator.report.plots import chunked_prefill

    def run(name, itl):
        return _trial(name, 256, [Point(0, "c4", {"concurrency": 4}, {"short/itl_ms_p99": itl})])

    t = run("b256", 100.0)
    t.runs = [run("b256-1", 120.0), run("b256-2", 110.0)]
    mean, half = point_between_runs(t, "c4", "short/itl_ms_p99")
    assert mean == 110.0 and 24.0 < half < 26.0  # t(2) 4.30 x sd 10 / sqrt 3
    assert point_between_runs(run("x", 5.0), "c4", "short/itl_ms_p99") == (5.0, 0.0)
    files = chunked_prefill(SweepData("chunked_prefill", [t, run("b512", 90.0)], "results"), tmp_path)
    assert files and files[0].name == "chunked_prefill_budget.png"


def test_every_lab_plot_draws_a_races_intervals_between_runs(tmp_path, monkeypatch):
    """Each lab's figure (and the overview of any sweep) draws a raced trial's values as means
    with error bars from the spread between its runs, and says so under the figure."""
    import matplotlib.axes
    import matplotlib.figure

    from orchestrator.decide.trials import SweepData
    from orchestrator.report.figures import generic
    from orchestrator.report.plots import LAB_PLOTS

    def run(name, k, scale):
        params = {
            "engine.max_num_batched_tokens": str(256 * k),
            "engine.enable_chunked_prefill": "True",
            "engine.enable_prefix_caching": "True",
            "workload.classes.main.prefix_tokens": str(128 * k),
            "engine.speculative_config.num_speculative_tokens": str(k),
            "engine.tensor_parallel_size": str(k),
            "workload.classes.main.input_tokens": str(64 * k),
        }
        keys = ("ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99", "tpot_ms_p50", "tokens_per_second", "qps")
        points = [
            Point(
                i,
                f"c{c}",
                {"concurrency": c},
                {
                    **{key: scale * c * (j + 1) for j, key in enumerate(keys)},
                    "short/itl_ms_p99": 30.0 * scale * c,
                    "long/ttft_ms_p99": 200.0 * scale * c,
                    "server_spec_decode_acceptance_rate": 0.5 * scale,
                    "server_prefix_cache_hit_rate": 0.5 * scale,
                },
            )
            for i, c in enumerate((1, 4))
        ]
        return TrialData(name, "FINISHED", params, {"memory_peak_gb_max": 1.0 * k}, points)

    trials = []
    for k in (1, 2):
        t = run(f"k{k}", k, 1.0)
        t.runs = [run(f"k{k}-1", k, 1.1), run(f"k{k}-2", k, 0.95)]
        trials.append(t)
    bars, words = [], []
    real_errorbar, real_text = matplotlib.axes.Axes.errorbar, matplotlib.figure.Figure.text
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "errorbar",
        lambda self, *a, **kw: (bars.append(kw.get("yerr")), real_errorbar(self, *a, **kw))[1],
    )
    monkeypatch.setattr(
        matplotlib.figure.Figure,
        "text",
        lambda self, x, y, s, **kw: (words.append(s), real_text(self, x, y, s, **kw))[1],
    )
    for name, builder in [*LAB_PLOTS.items(), ("overview", generic)]:
        bars.clear()
        words.clear()
        files = builder(SweepData(name, trials, "results"), tmp_path)
        assert files, name
        drawn = [b for b in bars if b is not None]
        assert drawn and all(h > 0 for b in drawn for h in b if math.isfinite(h)), (name, bars)
        assert any("95% interval between runs" in w for w in words), (name, words)
    one = [run("a", 1, 1.0), run("b", 2, 1.0)]
    words.clear()
    generic(SweepData("x", one, "results"), tmp_path)
    assert any("one run each: no error bars" in w for w in words)


def test_an_energy_verdict_says_which_energies_were_estimated_from_power():
    from orchestrator.config.schema import ObjectiveSpec
    from orchestrator.decide.verdict import decide

    objective = ObjectiveSpec.model_validate({"minimize": "joules_per_output_token", "at": "p0"})
    counted = _point(0, {"concurrency": 4}, joules_per_output_token=0.5, energy_from_counter=1.0)
    estimated = _point(0, {"concurrency": 4}, joules_per_output_token=0.4, energy_from_counter=0.0)
    v = decide([_trial("a", None, [counted]), _trial("b", None, [estimated])], objective)
    assert v.best.name == "b"
    assert any(line.startswith("Caution: the energy of b was ESTIMATED from power samples") for line in v.lines)


def test_runs_that_agree_have_no_spread_not_a_rounding_error():
    """Ten runs of a share that came out 0.9999999999999999 and 1.0 (the multi_lora lab's
    adapters_kept_min): the verdict quotes 1, not "1 ± 8.372e-17"."""
    from orchestrator.decide.objective import between_runs

    assert between_runs([0.9999999999999999, 1.0] * 5)[1] == 0.0
    mean, half = between_runs([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(2.4841, abs=1e-3)
