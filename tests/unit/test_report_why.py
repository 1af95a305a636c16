"""The report's why: what limited each trial, why the winner wins (through the diagnoses of the
trials closest to it), and the lab's claims checked: observed, not observed, not measurable."""

from __future__ import annotations

import pytest

from orchestrator.config import ConfigError, to_specs
from orchestrator.config.schema import ExpectationSpec, ObjectiveSpec
from orchestrator.decide.trials import Point, TrialData
from orchestrator.metrics.diagnosis import LoggedDiagnosis
from orchestrator.report import expectations
from orchestrator.report.explain import limits_section, why_winner


def diag(limiter, confidence="strong", detail="evidence"):
    return {
        "limiter": limiter,
        "confidence": confidence,
        "headline": f"limited by {limiter}",
        "findings": [{"cause": limiter, "confidence": confidence, "detail": detail, "evidence": {}}],
    }


def trial(name, budget, points, status="FINISHED", chunked="True", platform="cpu", error=""):
    params = {
        "engine.max_num_batched_tokens": str(budget),
        "engine.enable_chunked_prefill": chunked,
        "platform.name": platform,
    }
    pts = [
        Point(i, label, {"concurrency": i + 2}, m, "", LoggedDiagnosis.of(d)) for i, (label, m, d) in enumerate(points)
    ]
    return TrialData(name, status, params, {}, pts, error=error)


def chunked_sweep():
    def at_c4(itl, worst, ttft_long, per_prefill, limiter="prefill_interference"):
        m = {
            "itl_ms_p99": itl,
            "stall_worst_ms": worst,
            "stalls_per_prefill": per_prefill,
            "short/itl_ms_p99": itl,
            "long/ttft_ms_p50": ttft_long,
            "tokens_per_second": 220.0,
        }
        return ("c4", m, diag(limiter))

    return [
        trial("chunking_off", None, [at_c4(350, 408, 377, 1.0)], chunked="False"),
        trial("budget_256", 256, [at_c4(94, 95, 420, 2.8)]),
        trial("budget_512", 512, [at_c4(182, 196, 380, 1.5)]),
        trial("budget_2048", 2048, [at_c4(363, 398, 378, 1.0)]),
    ]


def test_what_limited_each_trial_is_a_table_of_every_point():
    lines = limits_section(chunked_sweep())
    assert lines[0] == "## What limited each trial"
    assert "| chunking_off | c4 | prefill interference | strong | evidence |  |" in lines


def test_why_the_winner_wins_names_the_mechanism_on_both_sides_and_the_cost():
    trials = chunked_sweep()
    objective = ObjectiveSpec(minimize="engine.max_num_batched_tokens")
    varied = ["engine.enable_chunked_prefill", "engine.max_num_batched_tokens"]
    lines = why_winner(trials[1], trials, varied, objective)
    text = "\n".join(lines)
    assert lines[0].startswith("**Why budget_256 wins**")
    # the closest trial in each knob: chunking off (both knobs differ) and the next budget, 512
    assert "Against chunking_off (engine.enable_chunked_prefill False -> True" in text
    assert "Against budget_512 (engine.max_num_batched_tokens 512 -> 256)" in text
    assert "Against budget_2048" not in text
    assert "worst stall (ms) 408 -> 95 (-77%)" in text and "ITL p99 (ms) 350 -> 94" in text
    assert "short/itl_ms_p99 350" not in text  # moved exactly as the pooled ITL p99: not said twice
    assert "stalled steps per interfering prefill 1 -> 2.8" in text
    assert "The cost: long/ttft_ms_p50 377 -> 420 (+11%)" in text
    assert "both were limited by prefill interference" in text


def test_no_winner_no_explanation():
    assert why_winner(None, chunked_sweep(), ["engine.max_num_batched_tokens"], ObjectiveSpec(maximize="x")) == []


def claims(*raw):
    return [ExpectationSpec.model_validate(c) for c in raw]


def test_each_form_of_claim_observed_or_not_with_its_numbers():
    trials = chunked_sweep()
    out = expectations.check(
        claims(
            {
                "claim": "spikes without chunking",
                "metric": "short/itl_ms_p99",
                "higher": "chunking_off",
                "than": "budget_256",
            },
            {
                "claim": "smaller chunks, smaller spikes",
                "metric": "itl_ms_p99",
                "along": "engine.max_num_batched_tokens",
                "trend": "increases",
            },
            {
                "claim": "smaller chunks, longer TTFT",
                "metric": "long/ttft_ms_p50",
                "along": "engine.max_num_batched_tokens",
                "trend": "decreases",
            },
            {"claim": "stalls without chunking", "limiter": "prefill_interference", "in": ["chunking_off"]},
            {"claim": "bounded", "metric": "tokens_per_second", "above": 100},
            {"claim": "same speed", "metric": "tokens_per_second", "within": 5, "of": "chunking_off"},
        ),
        trials,
    )
    assert [o.status for o in out] == ["observed", "observed", "observed", "observed", "observed", "observed"]
    assert out[0].numbers == "short/itl_ms_p99: chunking_off 350 > budget_256 94"
    assert out[1].numbers == "itl_ms_p99 by engine.max_num_batched_tokens: 256: 94, 512: 182, 2048: 363"
    assert "chunking_off at c4: prefill interference (strong)" in out[3].numbers
    nope = expectations.check(
        claims({"claim": "reversed", "metric": "short/itl_ms_p99", "lower": "chunking_off", "than": "budget_256"}),
        trials,
    )
    assert nope[0].status == "not observed" and "(by more than 5%)" in nope[0].numbers
    assert expectations.tally(out) == "Expectations: 6 observed, 0 not observed, 0 not measurable here (of 6)"


def test_a_limiter_claim_reads_every_run_of_a_raced_trial():
    """A race's first run can be the odd one out (disaggregated_pd, 2026-12-06: over capacity, then
    prefill interference twice): the claim holds where the cause limited most of the trial's runs."""

    def standard(*limiters):
        runs = [trial("standard", None, [("r1", {"itl_ms_p99": 900.0}, diag(c))]) for c in limiters]
        runs[0].runs = runs[1:]
        return [runs[0]]

    claim = claims({"claim": "stalls", "limiter": "prefill_interference", "in": "standard"})
    most = expectations.check(claim, standard("over_capacity", "prefill_interference", "prefill_interference"))
    assert most[0].status == "observed", most[0].numbers
    assert most[0].numbers == (
        "limited by prefill interference? standard at r1: prefill interference in 2 of 3 runs, over capacity in 1 of 3 runs"
    )
    half = expectations.check(claim, standard("prefill_interference", "over_capacity"))
    assert half[0].status == "not observed"  # one run of two is not most
    one = expectations.check(claim, standard("prefill_interference"))
    assert one[0].status == "observed" and one[0].numbers.endswith("standard at r1: prefill interference (strong)")


def test_a_tie_within_the_margin_and_a_noisy_trend_are_not_observed():
    trials = chunked_sweep()
    out = expectations.check(
        claims(
            {"claim": "c", "metric": "long/ttft_ms_p50", "higher": "budget_512", "than": "budget_2048"},  # 380 vs 378
            {
                "claim": "t",
                "metric": "stalls_per_prefill",
                "along": "engine.max_num_batched_tokens",
                "trend": "decreases",
            },
        ),
        trials,
    )
    assert out[0].status == "not observed"
    assert out[1].status == "observed"  # 2.8, 1.5, 1.0
    flat = expectations.check(
        claims(
            {
                "claim": "f",
                "metric": "tokens_per_second",
                "along": "engine.max_num_batched_tokens",
                "trend": "increases",
            }
        ),
        trials,
    )
    assert flat[0].status == "not observed"


def test_a_change_within_its_interval_is_not_measurable_here_and_a_tight_one_is_judged():
    """Issue 58: a claim the runs cannot decide says so, with the interval, instead of "not
    observed"; where the interval rules the claimed change out, it is not observed."""

    def sweep(half):
        out = []
        for name, budget, ttft in (
            ("budget_256", 256, 424.1),
            ("budget_512", 512, 423.0),
            ("budget_2048", 2048, 448.9),
        ):
            m = {"long/ttft_ms_p50": ttft}
            if half is not None:
                m |= {"long/ttft_ms_p50_within95_low": ttft - half, "long/ttft_ms_p50_within95_high": ttft + half}
            out.append(trial(name, budget, [("c4", m, diag("none"))]))
        return out

    claim = claims(
        {
            "claim": "smaller chunks, longer TTFT",
            "metric": "long/ttft_ms_p50",
            "along": "engine.max_num_batched_tokens",
            "trend": "decreases",
        },
        {"claim": "256 slower than 2048", "metric": "long/ttft_ms_p50", "higher": "budget_256", "than": "budget_2048"},
    )
    noisy = expectations.check(claim, sweep(60.0))  # +-60 ms on ~430: the change (-6%) could be +-20%
    assert [o.status for o in noisy] == ["not measurable here", "not measurable here"]
    assert "the change, -6%, has a 95% interval of ±20% here" in noisy[0].numbers
    assert noisy[0].numbers.startswith("long/ttft_ms_p50 by engine.max_num_batched_tokens: 256: 424.1,")
    tight = expectations.check(claim, sweep(5.0))  # +-5 ms: the change is surely under the 5% margin
    assert [o.status for o in tight] == ["not observed", "not observed"]
    assert [o.status for o in expectations.check(claim, sweep(None))] == ["not observed", "not observed"]


def test_not_measurable_here_says_why():
    trials = chunked_sweep() + [
        trial("sglang", 256, [], status="SKIPPED", error="InfeasibleConfigError: SGLang needs a GPU")
    ]
    out = expectations.check(
        claims(
            {"claim": "radix", "metric": "ttft_ms_p50", "lower": "sglang", "than": "budget_256"},
            {"claim": "graphs", "metric": "tpot_ms_p50", "lower": "budget_256", "than": "chunking_off", "needs": "gpu"},
            {"claim": "absent", "metric": "ttft_ms_p50", "lower": "lpm", "than": "budget_256"},
            {"claim": "no metric", "metric": "server_spec_decode_acceptance_rate", "above": 0.1},
        ),
        trials,
    )
    assert all(o.status == "not measurable here" for o in out)
    assert out[0].numbers == "sglang was SKIPPED: InfeasibleConfigError: SGLang needs a GPU"
    assert out[1].numbers == "needs a GPU; this sweep ran on cpu"
    assert out[2].numbers == "lpm was not run in this sweep"
    assert out[3].numbers == "chunking_off has no server_spec_decode_acceptance_rate"


def test_a_claim_read_at_an_invalid_point_says_so_and_within_nothing_is_not_observed():
    """A number read at a load point flagged INVALID (the client could not keep up, other
    processes took the CPU) judges a claim only with a caution, as the verdict does; a 'within'
    claim with no other trial left to compare is not measurable, not observed of nothing."""
    trials = chunked_sweep()
    trials[1].points[0].metrics["invalid"] = 1.0  # budget_256 at c4
    out = expectations.check(
        claims(
            {"claim": "smoother", "metric": "short/itl_ms_p99", "lower": "budget_256", "than": "chunking_off"},
            {
                "claim": "trend",
                "metric": "stalls_per_prefill",
                "along": "engine.max_num_batched_tokens",
                "trend": "decreases",
            },
            {"claim": "interference", "limiter": "prefill_interference", "in": "budget_256"},
            {"claim": "clean", "metric": "short/itl_ms_p99", "lower": "budget_512", "than": "chunking_off"},
            {"claim": "alone", "metric": "tokens_per_second", "within": 5, "of": "budget_256", "in": "budget_256"},
        ),
        trials,
    )
    caution = "caution: read at load points flagged INVALID (budget_256 at c4): judge with care"
    assert [o.status for o in out[:3]] == ["observed"] * 3
    assert all(o.numbers.endswith(caution) for o in out[:3]), [o.numbers for o in out]
    assert out[3].status == "observed" and "caution" not in out[3].numbers
    assert out[4].status == "not measurable here"
    assert out[4].numbers == "no finished trial besides budget_256 to compare with it"


def test_a_claim_needs_exactly_one_form():
    with pytest.raises(ValueError, match="exactly one form"):
        ExpectationSpec.model_validate({"claim": "x", "metric": "m"})
    with pytest.raises(ValueError, match="needs 'than'"):
        ExpectationSpec.model_validate({"claim": "x", "metric": "m", "lower": "a"})
    with pytest.raises(ValueError, match="needs 'trend"):
        ExpectationSpec.model_validate({"claim": "x", "metric": "m", "along": "engine.k"})
    with pytest.raises(ValueError, match="Extra inputs"):
        ExpectationSpec.model_validate({"claim": "x", "limiter": "none", "typo": 1})


def test_claims_are_validated_with_the_config_before_anything_starts(compose):
    with pytest.raises(ConfigError, match=r"expect\.0"):
        to_specs(compose(["+experiment=chunked_prefill", "variant=budget_256", "expect=[{claim: x, metric: m}]"]))
    _, settings = to_specs(compose(["+experiment=chunked_prefill", "variant=budget_256"]))
    assert settings.expect and all(e.claim for e in settings.expect)


def test_a_small_step_back_is_a_tie_not_a_broken_trend():
    def run(values):
        t = trial("t", None, [(f"r{i}", {"ttft_parts_queue_ms": v}, diag("none")) for i, v in enumerate(values)])
        claim = claims({"claim": "queue grows", "metric": "ttft_parts_queue_ms", "across_points": "increases"})
        return expectations.check(claim, [t])[0].status

    assert run([0.022, 0.013, 1113.0]) == "observed"  # 0.009 ms back against a 1113 ms rise
    assert run([100.0, 60.0, 120.0]) == "not observed"  # 40% back: not the trend
    assert run([100.0, 103.0]) == "not observed"  # within the 5% margin end to end


def test_a_section_set_in_one_trial_and_null_in_the_other_is_said_once():
    from orchestrator.decide.trials import TrialData
    from orchestrator.report.explain import knob_changes

    lora = TrialData(
        "a",
        "FINISHED",
        {"workload.adapters.active": "4", "workload.adapters.popularity": "uniform", "engine.max_loras": "2"},
        {},
        [],
    )
    plain = TrialData("b", "FINISHED", {"workload.adapters": "null", "engine.max_loras": "4"}, {}, [])
    knobs = ["engine.max_loras", "workload.adapters", "workload.adapters.active", "workload.adapters.popularity"]
    assert knob_changes(plain, lora, knobs) == "engine.max_loras 4 -> 2, workload.adapters null -> {...}"


def test_configurations_of_one_variant_are_told_apart_by_their_knobs():
    """A sweep of knobs within one variant (the grid of benchmarks/tune.py: ``variant=variable``
    with ``engine.max_num_seqs=1,32``) named every trial "variable": the verdict said "variable
    wins", and the race ran every "variable" again when one needed it."""
    from orchestrator.decide.trials import named, told_apart

    def cfg(seqs, budget, run_seed="0"):
        params = {"engine.max_num_seqs": seqs, "engine.max_num_batched_tokens": budget, "seed": run_seed}
        return TrialData("variable", "FINISHED", params, {}, [Point(0, "c1", {}, {"tokens_per_second": 5.0})])

    trials = [cfg("1", "2048"), cfg("32", "2048"), cfg("32", "64")]
    trials[1].runs.append(cfg("32", "2048", run_seed="7"))
    out = told_apart(trials)
    assert [t.name for t in out] == [
        "variable (max_num_batched_tokens=2048, max_num_seqs=1)",
        "variable (max_num_batched_tokens=2048, max_num_seqs=32)",
        "variable (max_num_batched_tokens=64, max_num_seqs=32)",
    ]
    assert out[1].runs[0].name == out[1].name  # a race's later run keeps its configuration's name
    assert [t.name for t in told_apart(chunked_sweep())] == [t.name for t in chunked_sweep()]  # unique: kept
    assert len(named(out, "variable")) == 3 and named(out, out[2].name) == [out[2]]
    claim = claims({"claim": "x", "metric": "tokens_per_second", "above": 1, "in": ["variable"]})
    got = expectations.check(claim, out)
    assert got[0].status == "not measurable here" and "3 trials are variable" in got[0].numbers
