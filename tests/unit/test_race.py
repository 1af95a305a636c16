"""The race: between-run comparisons that say how sure the verdict is (decide.race), the
rounds that repeat only the undecided trials (scheduling.rounds), and a sweep on the fake server
whose two identical configurations must never get a winner."""

from __future__ import annotations

import json
import math
import os
import subprocess

import pytest

from orchestrator.config.schema.goals import AUTO_MAX_RUNS
from orchestrator.decide.looks import Schedule, interim_looks, look_share, reach, runs_needed
from orchestrator.decide.race import BETTER, OPEN, TIE, TIED, WIN, planned_runs, race_state
from testkit.fake_openai_server import FakeOpenAIServer, Script
from testkit.races import simulate, two_names_sweep
from tests.conftest import ROOT, search_runs

pytestmark = pytest.mark.measures


def test_identical_configurations_never_get_a_winner():
    # the fake server's noise (run-to-run CV ~3% of its throughput): 20 races of 20 end without a
    # winner, two names for one configuration mostly tie within 10% (undecided otherwise)
    for n in (2, 4):
        answers = [simulate({f"t{i}": 100.0 for i in range(n)}, 0.03, seed) for seed in range(20)]
        assert WIN not in answers and TIED in answers, (n, answers)
    assert [simulate({"a": 100.0, "b": 100.0}, 0.02, seed) for seed in range(20)].count(TIED) >= 15
    # noisier machines (this one's ITL p99, worse): a false winner stays under the promised 5%
    # (all statements of a verdict together, every round), over many races
    for cv in (0.2, 0.5):
        answers = [simulate({"a": 100.0, "b": 100.0}, cv, seed) for seed in range(1000)]
        assert answers.count(WIN) <= 50, (cv, answers.count(WIN))
        # a tie is right here, but 3 runs at this noise can rarely show it (2 degrees of freedom)
        assert answers.count(TIED) <= 20, (cv, answers.count(TIED))


def test_what_a_round_shares_cancels_in_the_comparison():
    """Trials of one round run the same requests, back to back, on one server start when they
    share one: a round's common noise (here 10%, the level this machine shows between runs)
    cancels, and two names for one configuration tie as if the machine were quiet."""
    equal = {"a": 100.0, "b": 100.0}
    paired_runs: list[int] = []
    paired = [simulate(equal, 0.02, seed, "auto", shared=0.1, runs_out=paired_runs) for seed in range(200)]
    assert paired.count(WIN) <= 10 and paired.count(TIED) >= 190, (paired.count(WIN), paired.count(TIED))
    # the same noise, each run its own (nothing shared in a round): the tie takes several times the runs
    alone_runs: list[int] = []
    alone = [simulate(equal, 0.1, seed, "auto", runs_out=alone_runs) for seed in range(200)]
    assert alone.count(WIN) <= 10
    assert 3 * sorted(paired_runs)[100] <= sorted(alone_runs)[100], (sorted(paired_runs)[100], sorted(alone_runs)[100])


def test_a_real_difference_is_found_and_measured():
    answers = [simulate({"fast": 200.0, "slow": 100.0}, 0.1, seed) for seed in range(20)]
    assert answers.count(WIN) == 20, answers
    state = race_state({"fast": [200.0, 210.0, 190.0], "slow": [100.0, 98.0, 104.0]}, True, 0.95, 0.1, 3)
    (c,) = state.comparisons
    assert state.leader == "fast" and c.outcome == BETTER and c.low < c.ratio < c.high
    assert 1.5 < c.low and c.high < 2.7  # the leader's advantage as a ratio, about 2x
    # geometric means 199.8 / 100.6; at the last look of 3 runs at most, 3/4 of the 5% (look_share)
    assert c.words(True) == "by 99% (interval +79% to +120%)"
    # minimize: the lower one leads, and the words say how much lower
    state = race_state({"fast": [200.0, 210.0, 190.0], "slow": [100.0, 98.0, 104.0]}, False, 0.95, 0.1, 3)
    assert state.leader == "slow" and state.comparisons[0].words(False) == "by 50% (interval +44% to +55%)"


def test_the_rule_is_stricter_with_more_contenders_and_looks():
    runs = {"a": [100.0, 112.0, 95.0], "b": [90.0, 76.0, 80.0]}
    one = race_state(runs, True, 0.95, 0.0, 2)
    many = race_state({**runs, "c": [10.0, 9.0, 11.0], "d": [5.5, 6.0, 5.0]}, True, 0.95, 0.0, 5)
    # 0.95 against 1 - 0.05 x 0.9375 / 3: three contenders, and the last look of 5 runs at most
    # spends what the interim look at 2 runs left (1 - 1/16)
    assert one.level < many.level and math.isclose(many.level, 1 - 0.05 * (1 - 1 / 16) / 3)
    assert one.comparisons[0].outcome == BETTER and many.comparisons[0].outcome != BETTER


def test_the_error_is_spent_over_a_few_looks_mostly_at_the_last_and_adds_up_to_alpha():
    assert interim_looks(60) == [2, 3, 5, 8, 12, 18, 27, 41] and interim_looks(3) == [2] and interim_looks(2) == []
    for reference in (2, 3, 5, 10, 60):
        looks = interim_looks(reference)
        shares = [look_share(n, reference, final=False) for n in looks]
        assert shares == sorted(shares)
        # whichever look is the last (the plan, the cap, the budget), what was spent adds up to alpha
        for k in range(len(looks) + 1):
            last = looks[k] if k < len(looks) else reference
            assert math.isclose(sum(shares[:k]) + look_share(last, reference, final=True), 1.0)
    assert look_share(4, 60, final=False) == 0.0  # between looks nothing is spent, nothing decided
    assert look_share(27, 60, final=True) > 0.9  # a race planned for 27 of 60 runs keeps 92% for its last look
    assert look_share(3, 3, final=True) == 0.75 and look_share(2, 3, final=False) == 0.25
    assert look_share(7, 4, final=False) == look_share(4, 4, final=True)  # past the last: judged as the last
    # a race of 3 runs can still decide a 2x difference at the first look
    assert race_state({"a": [200.0, 205.0], "b": [100.0, 101.0]}, True, 0.95, 0.1, 3).answer == WIN
    # of 60 runs at most it spends almost nothing at 2 runs (no decision), and a verdict after a race
    # stopped there (the budget) spends the rest: the last look's
    two = {"a": [200.0, 205.0], "b": [100.0, 101.0]}
    assert race_state(two, True, 0.95, 0.1, AUTO_MAX_RUNS, final=False).answer == OPEN
    assert race_state(two, True, 0.95, 0.1, AUTO_MAX_RUNS).answer == WIN


def test_the_schedule_plans_and_lengthens_never_shortens():
    auto = Schedule(AUTO_MAX_RUNS, auto=True)
    assert auto.plan is None and not auto.last(3) and not auto.plans_at(2) and auto.plans_at(3)
    assert not auto.plans_at(4) and auto.plans_at(5)  # again at each later look
    assert auto.replan(9) and auto.plan == 9 and auto.last(9) and not auto.last(8)
    assert auto.replan(14) and not auto.replan(5) and auto.plan == 14  # lengthened, never shortened
    fixed = Schedule(3)
    assert fixed.plan == 3 and fixed.looks_at(2) and fixed.last(3) and not fixed.plans_at(3)
    knob = Schedule(6, every_round=True)
    assert all(knob.looks_at(n) for n in range(2, 6))


def test_an_undecided_race_says_how_many_runs_would_decide_it():
    bound = math.log1p(0.1)
    quiet, noisy = runs_needed(0.03, 0.0, bound, 0.05), runs_needed(0.08, 0.0, bound, 0.05)
    assert quiet is not None and noisy is not None and 2 <= quiet <= 4 and 15 <= noisy <= 30, (quiet, noisy)
    assert runs_needed(0.08, 0.03, bound, 0.05) > noisy  # a small real difference: harder to call a tie
    assert runs_needed(0.08, 0.3, bound, 0.05) < 8  # far beyond the margin: a few runs
    assert runs_needed(0.08, bound, bound, 0.05) is None  # on the margin itself: never
    # checked against the race itself: with the runs it names, most races at that noise tie
    ties = [simulate({"a": 100.0, "b": 100.0}, 0.03, seed, max_repeats=quiet) for seed in range(200)]
    assert ties.count(TIED) >= 150, ties.count(TIED)
    state = race_state({"a": [100.0, 108.0, 93.0], "b": [101.0, 92.0, 107.0]}, True, 0.95, 0.1, 3)
    assert state.answer == OPEN and (state.runs_to_decide(state.comparisons[0].name) or 0) > 3


def test_a_race_stopped_short_says_what_deciding_costs_and_what_its_runs_can_tell():
    """Where the budget stops a race before it decides, the progress line says the runs each and the
    time deciding takes here, and what the runs made can tell at the noise measured."""
    from orchestrator.scheduling.rounds import _cost

    bound, alpha = math.log1p(0.1), 0.05
    for sd in (0.03, 0.08):  # the reach at n runs is the room runs_needed asks of n runs
        n = runs_needed(sd, 0.3, bound, alpha)
        assert n is not None
        assert (
            reach(n, sd, alpha, 2, 0.8, n, tie=False) <= 0.3 - bound < reach(n - 1, sd, alpha, 2, 0.8, n - 1, tie=False)
        )
    noisy = race_state({"a": [100.0, 125.0], "b": [70.0, 80.0]}, True, 0.95, 0.1, 2)
    assert noisy.answer == OPEN
    said = _cost(noisy, 2, 60.0, 0.9, 120.0)
    need = noisy.runs_to_decide_all()
    assert need is not None and need > 2
    assert f"deciding needs about {need} runs each (~{(need - 2)}m00s more here" in said, said
    assert f"objective.max_repeats={need} objective.budget={0.9 + (need - 2) * 60 / 120:.1f}" in said, said
    assert "at 2 runs each this machine tells a difference over" in said and "no tie" in said, said
    quiet = race_state(
        {"a": [100.0, 101.0, 100.5, 99.5, 100.0], "b": [120.0, 121.0, 119.0, 120.5, 120.0]}, True, 0.95, 0.1, 5
    )
    assert "a tie only under" in quiet.tells_at(5), quiet.tells_at(5)


def test_past_its_budget_a_race_runs_on_once_where_deciding_fits_the_stretch():
    import time

    from orchestrator.config.schema import ObjectiveSpec
    from orchestrator.scheduling.rounds import _stretch

    objective = ObjectiveSpec(maximize="tokens_per_second")  # budget 1, stretch 2 (first passes)
    noisy = race_state({"a": [100.0, 125.0], "b": [70.0, 80.0]}, True, 0.95, 0.1, 2)
    need = noisy.runs_to_decide_all()
    assert need == 7
    said: list[str] = []
    now = time.monotonic()
    # 5 more rounds of 60 s fit in a ceiling 400 s away: the new deadline covers them, with a tenth to spare
    deadline = _stretch(noisy, 2, 60.0, now + 400.0, objective, said.append)
    assert deadline is not None and now + 300.0 < deadline <= time.monotonic() + 331.0
    assert said == [
        "race: past its budget (objective.budget=1 first passes): deciding needs about 7 runs each "
        "(~5m00s more here), within objective.stretch=2: running them"
    ]
    assert _stretch(noisy, 2, 60.0, now + 200.0, objective, said.append) is None  # they do not fit
    tie = race_state({"a": [100.0, 180.0], "b": [140.0, 90.0]}, True, 0.95, 0.1, 2)
    assert tie.runs_to_decide_all() is None and _stretch(tie, 2, 1.0, now + 1e6, objective, said.append) is None
    assert len(said) == 1


def test_auto_plans_the_runs_from_the_noise_and_the_budget():
    """max_repeats: auto plans after the pilot's third run (and at later looks), from the spread between runs only:
    a few runs on a quiet machine, up to the cap on a noisy one, never past the budget; a race of
    two equal trials then ties more often than with three runs, and never names a false winner
    more often than promised."""
    quiet = race_state({"a": [100.0, 103.0, 101.0], "b": [101.0, 98.0, 100.0]}, True, 0.95, 0.1, AUTO_MAX_RUNS)
    noisy = race_state({"a": [100.0, 125.0, 90.0], "b": [112.0, 88.0, 104.0]}, True, 0.95, 0.1, AUTO_MAX_RUNS)
    assert 3 <= planned_runs(quiet, 99, AUTO_MAX_RUNS) <= 5
    assert planned_runs(noisy, 99, AUTO_MAX_RUNS) == AUTO_MAX_RUNS  # 14% between runs: more than the cap
    assert planned_runs(noisy, 5, AUTO_MAX_RUNS) == 5  # what the budget affords
    assert planned_runs(noisy, 1, AUTO_MAX_RUNS) == 3  # the runs already made
    # the same plan whatever the difference seen: only the spread enters it
    apart = race_state({"a": [100.0, 125.0, 90.0], "b": [224.0, 176.0, 208.0]}, True, 0.95, 0.1, AUTO_MAX_RUNS)
    assert planned_runs(apart, 99, AUTO_MAX_RUNS) == planned_runs(noisy, 99, AUTO_MAX_RUNS)
    equal = {"a": 100.0, "b": 100.0}
    auto = [simulate(equal, 0.1, seed, "auto") for seed in range(300)]
    three = [simulate(equal, 0.1, seed, 3) for seed in range(300)]
    assert auto.count(WIN) <= 15 and auto.count(TIED) > three.count(TIED), (auto.count(TIED), three.count(TIED))
    assert simulate({"fast": 200.0, "slow": 100.0}, 0.1, 0, "auto") == WIN


def test_one_run_each_is_not_a_race_and_values_that_never_vary_are_exact():
    assert race_state({"a": [1.0], "b": [2.0]}, True).answer == "one run"
    state = race_state({"a": [4.0, 4.0], "b": [4.0, 4.0]}, True, margin=0.0)
    assert state.comparisons[0].outcome == TIE
    state = race_state({"a": [0.0, 1.0], "b": [3.0, 4.0]}, True)  # a zero: compared on the linear scale
    assert not state.comparisons[0].log_scale and state.leader == "b"


def test_a_sweep_of_two_identical_configurations_ends_in_a_tie_never_a_winner(tmp_path):
    """Two trials measured alike (a timeout no request comes near) on a fake
    server whose every request's pace varies by ~10%: all run twice, then only while undecided;
    the verdict says tie (or undecided), the repeats are child runs of their trial in MLflow, the
    sweep's run carries the decision, and the report rebuilt from MLflow agrees."""
    store = f"sqlite:///{tmp_path}/mlflow.db"
    with FakeOpenAIServer(Script(ttft_s=0.01, itl_s=0.004, jitter=0.1)) as srv:
        objective = "{maximize:tokens_per_second,margin:0.1,max_repeats:auto,budget:20}"
        cmd = two_names_sweep(srv.base_url, store, f"{tmp_path}/multirun", objective)
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = p.stdout
    assert p.returncode == 0, out[-3000:] + p.stderr[-3000:]  # decided (a tie); 4 would be undecided
    assert "race: run 2 of" in out and "run-to-run noise is not known yet" in out, out[-3000:]
    verdict = next(line for line in out.splitlines() if line.startswith("Verdict:"))
    assert "tie within the margin of 10%" in verdict and " wins" not in verdict, verdict
    # A tie at the first look (2 runs) is honest: its share of the error (0.05 (1/59)^2) needs the
    # runs within ~0.05% of each other, which a quiet machine's 0.3-0.5% spread gives now and then.
    # Then no plan is made (the pilot is 3 runs) and one round was run.
    early = "race: decided after 2 runs (tie)" in out
    planned = 2
    if early:
        assert "race: planning " not in out, out[-3000:]
    else:
        assert "race: planning " in out, out[-4000:]
        rounds = [
            line.split("race: run ", 1)[1].split(" of ", 1)[1].split(" (")[0]
            for line in out.splitlines()
            if "race: run " in line
        ]
        assert rounds[0].split(", ") == rounds[1].split(", ")[::-1], rounds  # each round starts with another trial
        # max_repeats: auto, planned after the third run (and again at later looks, only ever longer)
        plans = [int(part.split()[0]) for part in out.split("race: planning ")[1:]]
        planned = plans[-1]
        assert 2 <= plans[0] <= planned <= AUTO_MAX_RUNS and plans == sorted(plans), plans
    assert "95% confidence for all its statements together" in verdict
    runs = search_runs(store, "default")
    trials = {r.info.run_id: r for r in runs if r.data.tags.get("run_kind") == "trial"}
    repeats = [r for r in runs if r.data.tags.get("run_kind") == "repeat"]
    assert len(trials) == 2 and len(repeats) >= 2
    for r in repeats:  # each repeat a child of its trial's run, tagged with the sweep's
        parent = trials[r.data.tags["mlflow.parentRunId"]]
        assert r.data.tags["repeat_of"] == parent.data.tags["trial_hash"]
        assert 1 <= int(r.data.tags["race_run"]) < planned
    for t in trials.values():  # each trial's run carries its mean and interval between runs
        m = t.data.metrics
        assert m["tokens_per_second_runs"] >= 2
        assert m["tokens_per_second_ci95_low"] < m["tokens_per_second_runs_mean"] < m["tokens_per_second_ci95_high"]
    sweep = next(r for r in runs if r.data.tags.get("run_kind") == "sweep")
    assert sweep.data.tags["verdict_decision"] == "tie" and sweep.data.tags["verdict_confidence"] == "0.95"
    assert sweep.data.tags.get("race_planned_runs") == (None if early else str(planned))
    from orchestrator.decide.verdict import decide
    from orchestrator.report import from_mlflow

    data = from_mlflow(store, "default")
    # the verdict needs no plan to spend its error as the race did: the objective as the user set it
    assert data.objective is not None and data.objective.max_repeats == "auto"
    assert sorted(len(t.runs) for t in data.trials) == sorted(
        sum(1 for r in repeats if r.data.tags["repeat_of"] == t.data.tags["trial_hash"]) for t in trials.values()
    )
    again = decide(data.finished, data.objective)
    assert again.decision == sweep.data.tags["verdict_decision"]
    result = json.loads(next((tmp_path / "multirun").glob("trials/*/result.json")).read_text())
    assert "repeat_of" in result


def test_a_race_the_budget_stops_says_what_its_last_look_decided_or_what_deciding_costs(monkeypatch):
    """The budget's stop is the race's last look (it spends what the looks before left): its line
    says what that look decided, what deciding would cost, or (one run each) nothing more."""
    from types import SimpleNamespace

    from orchestrator.config.schema import ObjectiveSpec
    from orchestrator.scheduling import rounds

    objective = ObjectiveSpec(maximize="tokens_per_second")
    said: list[str] = []
    record = SimpleNamespace(results=[], progress=said.append)
    looks: list[bool] = []

    def stands(state):
        def standing(results, objective, final=False):
            looks.append(final)
            return state

        return standing

    head = "race: stopping before run 3: a round of 2 trial(s) takes ~60s, the budget has 10s left (objective.budget=1 first passes)"
    noisy = race_state({"a": [100.0, 125.0], "b": [70.0, 80.0]}, True, 0.95, 0.1, 2)
    monkeypatch.setattr(rounds, "standing", stands(noisy))
    assert rounds._stopped(record, objective, noisy, 2, (2, 60.0, 10.0), 120.0) is noisy
    assert looks == [True] and said[-1].startswith(head + "; deciding needs about 7 runs each (~5m00s more here"), said
    apart = race_state({"a": [100.0, 101.0], "b": [200.0, 202.0]}, True, 0.95, 0.1, 2)
    monkeypatch.setattr(rounds, "standing", stands(apart))
    rounds._stopped(record, objective, noisy, 2, (2, 60.0, 10.0), 120.0)
    assert apart.answer == WIN and said[-1] == head + "; decided at this, its last look (win)", said[-1]
    one = race_state({"a": [100.0], "b": [200.0]}, True, 0.95, 0.1, 1)
    monkeypatch.setattr(rounds, "standing", stands(one))
    rounds._stopped(record, objective, one, 1, (2, 60.0, 10.0), 120.0)
    assert said[-1] == head.replace("run 3", "run 2"), said[-1]


def test_a_resumed_sweep_reads_its_race_back_from_mlflow_and_races_on(tmp_path):
    """The same command again (resume) with a larger max_repeats: the trials and the repeats an
    earlier sweep FINISHED are read back from MLflow, not run again; only the new round runs, and
    the verdict covers every run."""
    store = f"sqlite:///{tmp_path}/mlflow.db"

    def sweep(max_repeats: int) -> str:
        # margin 0: no tie can end the race early; confidence 1 - 1e-6: no winner either, between two
        # trials measured alike (at the look after 2 runs, t on 2 degrees of freedom must pass ~700: their
        # runs ~0.5% apart would need to differ by ~350%). So each sweep ends undecided at its
        # max_repeats, said in the exit status (4), and the second has a third round to run.
        objective = f"{{maximize:tokens_per_second,max_repeats:{max_repeats},budget:20,margin:0,confidence:0.999999}}"
        cmd = two_names_sweep(srv.base_url, store, f"{tmp_path}/multirun{max_repeats}", objective, 16)
        env = {**os.environ, "INFERENCE_LAB_CACHE": str(tmp_path / "cache")}  # the race's memory of this machine
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
        assert p.returncode == 4, p.stdout[-3000:] + p.stderr[-3000:]
        assert "undecided after the budget" in p.stdout, p.stdout[-3000:]
        return p.stdout

    with FakeOpenAIServer(Script(ttft_s=0.01, itl_s=0.004, jitter=0.1)) as srv:
        first = sweep(2)
        again = sweep(3)
    assert "2 FINISHED, 2 repeat FINISHED" in first, first[-3000:]
    # before its first trial, the second sweep says how the first one's race ended here
    assert "race: last time on this machine" not in first
    said = next(line for line in again.splitlines() if "race: last time on this machine (" in line)
    assert "it ended undecided after 2 runs each" in said, said
    assert again.count("already FINISHED") == 2 and "nothing to run" not in again, again[-3000:]
    # the two trials and their second runs read back; their third runs measured now
    assert again.count("read back from MLflow (resume)") == 4, again[-3000:]
    assert "2 repeat FINISHED" in again and "2 ALREADY_FINISHED" in again, again[-3000:]
    verdict = next(line for line in again.splitlines() if line.startswith("Verdict:"))
    assert "3 runs each" in verdict, verdict
    runs = search_runs(store, "default")
    repeats = [r for r in runs if r.data.tags.get("run_kind") == "repeat"]
    assert sorted(r.data.tags["race_run"] for r in repeats) == ["1", "1", "2", "2"]  # none measured twice
    assert len([r for r in runs if r.data.tags.get("run_kind") == "trial"]) == 2


def _trial(name: str, budget: int, ttfts: list[float]):
    """A chunked-prefill trial whose runs measured these long-prompt TTFT p99s."""
    from orchestrator.decide.trials import Point, TrialData

    def one(ttft: float, suffix: str = ""):
        point = Point(0, "c4", {"concurrency": 4}, {"long/ttft_ms_p99": ttft})
        params = {"engine.max_num_batched_tokens": str(budget)}
        return TrialData(name + suffix, "FINISHED", params, {}, [point], trial_hash=name + suffix)

    first = one(ttfts[0])
    first.runs = [one(t, f"-run{i}") for i, t in enumerate(ttfts[1:], 1)]
    return first


def test_a_knob_objective_is_sure_only_of_the_constraints():
    """minimize the budget subject to TTFT p99 <= 2000: a smaller budget that met the bound in
    one run of two is uncertain, so the verdict is undecided; once it misses in every run, the
    next budget wins, having met the bound in all of its runs."""
    from orchestrator.config.schema import ObjectiveSpec
    from orchestrator.decide.verdict import decide

    objective = ObjectiveSpec(minimize="engine.max_num_batched_tokens", subject_to={"long/ttft_ms_p99": 2000})
    small, mid = _trial("b256", 256, [1900.0, 2300.0]), _trial("b512", 512, [900.0, 1000.0])
    verdict = decide([small, mid], objective)
    assert verdict.decision == OPEN and verdict.best is mid and verdict.undecided == [small]
    assert "undecided after the budget: b256 or b512" in verdict.headline
    assert any("uncertain, <= 2000 in 1 of 2 runs" in why for _, why in verdict.excluded)
    small = _trial("b256", 256, [2100.0, 2300.0, 2250.0])
    verdict = decide([small, mid], objective)
    assert verdict.decision == WIN and "met the constraints in all 2 of its runs" in verdict.headline
    # how sure: one-sided limits between runs, the 5% split over the two statements (t on 1 and 2 df):
    # b512's TTFT at most 950 + t(1) x 50; b256's at least 2216.7 - t(2) x 60.1 = 1958: not past 2000
    assert (
        "but not yet with 95% confidence (one-sided limits between runs: b256: long/ttft_ms_p99 at least 1958 (>= 2000))"
        in verdict.headline
    ), verdict.headline
    assert "more runs would tell" in verdict.headline
    small = _trial("b256", 256, [2600.0, 2700.0, 2650.0])
    verdict = decide([small, mid], objective)
    assert (
        "with 95% confidence for all these statements together (one-sided limits between runs: "
        "long/ttft_ms_p99 at most 1585 (<= 2000); b256: long/ttft_ms_p99 at least 2526 (>= 2000))"
    ) in verdict.headline, verdict.headline


def test_a_knob_race_runs_on_until_its_limits_hold_and_plans_the_runs_they_need():
    """The knob race after agreement between runs: b512 met the bound in both runs, b256 missed it
    in all three, but b256's lower limit (1958) is not past the bound yet: undecided, both run
    again, and the plan is the runs at which the limits would hold at the spread measured. With
    its runs far from the bound it is decided; between looks nothing is told."""
    from orchestrator.config.schema import ObjectiveSpec
    from orchestrator.decide.race import planned_runs
    from orchestrator.decide.verdict import decide, knob_standing

    objective = ObjectiveSpec(minimize="engine.max_num_batched_tokens", subject_to={"long/ttft_ms_p99": 2000})
    # after the first pass: the best and the better knob run again, not a worse knob (b1024)
    firsts = [_trial("b256", 256, [2100.0]), _trial("b512", 512, [900.0]), _trial("b1024", 1024, [800.0])]
    state = knob_standing(decide(firsts, objective), objective, final=False)
    assert state is not None and state.answer == OPEN and state.to_repeat() == ["b512", "b256"]
    small, mid = _trial("b256", 256, [2100.0, 2300.0, 2250.0]), _trial("b512", 512, [900.0, 1000.0, 950.0])
    state = knob_standing(decide([small, mid], objective), objective, final=False)
    assert state is not None and state.answer == OPEN and state.leader == "b512"
    assert state.to_repeat() == ["b512", "b256"]
    assert state.need is not None and 3 < state.need <= 10, state.need
    assert planned_runs(state, affordable=30, cap=AUTO_MAX_RUNS) == state.need
    assert planned_runs(state, affordable=4, cap=AUTO_MAX_RUNS) == 4  # the budget's runs at most
    # at the runs it needs (the same mean and spread), the last look holds and decides
    k = state.need
    spread = [2100.0, 2300.0, 2250.0] * k
    small, mid = _trial("b256", 256, spread[:k]), _trial("b512", 512, ([900.0, 1000.0, 950.0] * k)[:k])
    verdict = decide([small, mid], objective)
    assert knob_standing(verdict, objective, final=True).answer == WIN
    assert "with 95% confidence for all these statements together" in verdict.headline, verdict.headline
    # only the best's own constraint unsure: the best alone runs again
    near = _trial("b512", 512, [1500.0, 1990.0, 1700.0])
    state = knob_standing(decide([_trial("b256", 256, [5000.0, 5100.0, 4900.0]), near], objective), objective, True)
    assert state.answer == OPEN and state.to_repeat() == ["b512"] and state.need is not None and state.need > 3
    # a round that is no look (4 runs: the looks are at 2, 3, 5, ...): nothing is told there
    far = _trial("b256", 256, [5000.0, 5100.0, 4900.0, 5000.0]), _trial("b512", 512, [900.0, 950.0, 1000.0, 925.0])
    assert knob_standing(decide(list(far), objective), objective, final=False).answer == OPEN
    assert knob_standing(decide(list(far), objective), objective, final=True).answer == WIN


def test_rounds_are_blocks_once_they_pay_and_then_the_comparison_is_the_paired_t_test():
    """Two trials over five complete rounds: the blocked fit is the paired t-test (scipy's);
    over three rounds (2 degrees of freedom paired) every run's spread is pooled instead."""
    import numpy as np
    from scipy import stats

    from orchestrator.decide.race import blocked_fit

    a = [100.0, 131.0, 92.0, 118.0, 104.0]
    b = [97.0, 126.0, 95.0, 112.0, 99.0]
    y = {"a": dict(enumerate(np.log(a))), "b": dict(enumerate(np.log(b)))}
    fit = blocked_fit(y)
    diff = np.log(a) - np.log(b)
    t_paired = stats.ttest_rel(np.log(a), np.log(b)).statistic
    assert fit.paired and fit.df == 4
    assert math.isclose((fit.effect["a"] - fit.effect["b"]) / (fit.sd * math.sqrt(fit.contrast("a", "b"))), t_paired)
    assert math.isclose(fit.effect["a"] - fit.effect["b"], diff.mean())
    state = race_state({"a": a, "b": b}, True, 0.95, 0.1, 5)
    assert state.paired and state.df == 4
    three = race_state({"a": a[:3], "b": b[:3]}, True, 0.95, 0.1, 3)
    assert not three.paired and three.df == 4  # pooled: 2 x (3 - 1)
    # a trial whose runs share no round with the others (its first run lost, say): pooled too
    apart = race_state({"a": dict(enumerate(a)), "b": {10 + i: x for i, x in enumerate(b)}}, True)
    assert not apart.paired and apart.df == 8


def test_a_race_is_remembered_per_machine_and_trials_and_forecast_before_the_next(tmp_path, monkeypatch):
    """How a race ended is kept under the machine, the experiment, what it compares and its trials
    (not its budget), and said before the next sweep of the same trials, with what this budget affords."""
    from types import SimpleNamespace

    from orchestrator.config.schema import ObjectiveSpec
    from orchestrator.scheduling.race_memory import forecast, remember

    monkeypatch.setenv("INFERENCE_LAB_CACHE", str(tmp_path))

    def jobs(budget: float, hashes=("h1", "h2")):
        objective = ObjectiveSpec(maximize="tokens_per_second", budget=budget)
        return [
            SimpleNamespace(
                trial_hash=h, spec=SimpleNamespace(experiment="lab"), settings=SimpleNamespace(objective=objective)
            )
            for h in hashes
        ]

    assert forecast(jobs(1.0)) is None  # nothing known yet
    noisy = race_state({"a": [100.0, 125.0], "b": [70.0, 80.0]}, True, 0.95, 0.1, 2)
    need = noisy.runs_to_decide_all()
    remember(jobs(1.0), noisy, 2, 60.0, 120.0)
    said = forecast(jobs(2.0))  # another budget: the same race
    assert said is not None and said.startswith("race: last time on this machine ("), said
    assert f"ended undecided after 2 runs each: deciding needs about {need} runs each" in said, said
    # this budget: 2 first passes of 120 s, a first pass then rounds of 60 s: 1 + 4 runs
    assert f"this budget affords about 5 (objective.budget=2; {(need - 1) * 60 / 120:.1f} would afford {need})" in said
    assert forecast(jobs(1.0, ("h1", "h3"))) is None  # other trials: another race
    quiet = race_state({"a": [100.0, 101.0, 100.5], "b": [150.0, 151.0, 149.0]}, True, 0.95, 0.1, 3)
    remember(jobs(1.0), quiet, 3, 60.0, 120.0)
    assert "it decided after 3 runs each (win)" in (forecast(jobs(1.0)) or "")
