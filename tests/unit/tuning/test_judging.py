"""Whether a step adopts (orchestrator.tuning.judging, and the loop's Tuner.judge): a candidate that
beats the incumbent with the race's confidence is adopted; a tie, an undecided race, a leading
incumbent or a candidate out of the race keeps the incumbent; an undecided lead gets a second look
that continues its race."""

from __future__ import annotations

import dataclasses

from orchestrator.config.schema import ObjectiveSpec
from orchestrator.decide.race import Outcome, race_state
from orchestrator.decide.trials import Point, TrialData
from orchestrator.decide.verdict import race_over
from orchestrator.tuning.candidates import Candidate, RacedBefore, continued_race
from orchestrator.tuning.judging import gain, judge_race, judge_step
from orchestrator.tuning.path import Step, undecided_hint

THROUGHPUT = ObjectiveSpec(maximize="tokens_per_second", max_repeats=4)


def runs(name: str, values: list[float], key: str = "tokens_per_second", **more: float) -> TrialData:
    """A configuration's runs in one step's launch: its first pass and the race's repeats, by round."""
    made = [
        TrialData(name, "FINISHED", {}, {}, [Point(0, "c8", {"concurrency": 8}, {key: v, **more})], round=r)
        for r, v in enumerate(values)
    ]
    return dataclasses.replace(made[0], runs=made[1:])


def test_a_confident_win_adopts_the_candidate() -> None:
    named = {"baseline": runs("baseline", [100, 102, 99, 101]), "seqs=8": runs("seqs=8", [160, 163, 158, 161])}
    judged = judge_race(named, "baseline", THROUGHPUT)
    assert judged.outcome.adopted == "seqs=8" and judged.outcome.comparison is not None
    assert judged.outcome.comparison.outcome == Outcome.BETTER
    mid, lo, hi = gain(judged.outcome.comparison)
    assert 0 < lo < mid < hi and 0.5 < mid < 0.7
    assert judged.decision.startswith("seqs=8 adopted: tokens_per_second +60%")
    assert set(judged.values) == {"baseline", "seqs=8"} and judged.values["baseline"][0] == 100.5


def test_a_tie_keeps_the_incumbent() -> None:
    named = {"baseline": runs("baseline", [100, 101, 99, 100.5]), "x": runs("x", [100.2, 100.8, 99.5, 100.1])}
    judged = judge_race(named, "baseline", THROUGHPUT.model_copy(update={"margin": 0.1}))
    assert judged.outcome.adopted is None and judged.outcome.led_undecided is None
    assert judged.decision.startswith("the incumbent stays") and judged.decision.endswith("a tie within the margin")


def test_an_undecided_race_keeps_the_incumbent_and_marks_the_lead() -> None:
    named = {"baseline": runs("baseline", [100, 130]), "x": runs("x", [125, 110])}
    judged = judge_race(named, "baseline", THROUGHPUT)
    assert judged.outcome.adopted is None and judged.outcome.undecided
    assert judged.outcome.led_undecided == "x" and judged.decision.endswith("undecided")


def test_a_leading_incumbent_keeps_its_place() -> None:
    named = {"baseline": runs("baseline", [100, 101, 99, 100.5]), "x": runs("x", [70, 71, 69, 70.5])}
    judged = judge_race(named, "baseline", THROUGHPUT)
    assert judged.outcome.adopted is None and judged.outcome.led_undecided is None
    assert "x tokens_per_second -30%" in judged.decision and judged.decision.endswith("worse")


def test_a_candidate_out_of_the_race_keeps_the_incumbent_and_says_why() -> None:
    guarded = THROUGHPUT.model_copy(update={"subject_to": {"ttft_ms_p99": 500.0}})
    named = {
        "baseline": runs("baseline", [100, 101], ttft_ms_p99=300.0),
        "x": runs("x", [200, 201], ttft_ms_p99=900.0),  # twice as fast, but misses the TTFT bound
    }
    judged = judge_race(named, "baseline", guarded)
    assert judged.outcome.adopted is None and judged.state is None
    assert "(out of the race: x: ttft_ms_p99 900 (2 runs), needs <= 500)" in judged.decision


def test_the_loop_adopts_what_the_race_adopts_and_remembers_each_race(tmp_path) -> None:
    """Tuner.judge, without Hydra or a launcher: the step records the adoption and its gain."""
    from orchestrator.tuning.loop import Tuner
    from orchestrator.tuning.record import TuningRecord
    from tests.unit.tuning.test_planner import planner

    tuner = object.__new__(Tuner)
    tuner.objective, tuner.json_plan = THROUGHPUT, False
    tuner.record, tuner.planner = TuningRecord(tmp_path, None, "x"), planner()
    inc, win, tie = Candidate("baseline", {}), Candidate("seqs=8", {"engine.max_num_seqs": 8}), Candidate("t", {"t": 1})
    step = Step(1, "baseline", "limited by batch slots", ["batch_slots"])
    named = {
        "baseline": runs("baseline", [100, 102, 99, 101]),
        "seqs=8": runs("seqs=8", [160, 163, 158, 161]),
        "t": runs("t", [101, 100, 100, 102]),
    }
    assert tuner.judge(step, inc, [win, tie], named) is win
    assert step.adopted == "seqs=8" and step.adopted_knobs == {"engine.max_num_seqs": 8}
    assert step.gain is not None and 0.5 < step.gain[0] < 0.7
    assert set(tuner.planner.tried) == {'{"engine.max_num_seqs": 8}', '{"t": 1}'}
    step2 = Step(2, "seqs=8", "", [])
    worse = {"seqs=8": runs("seqs=8", [160, 163, 158, 161]), "t": runs("t", [101, 100, 100, 102])}
    assert tuner.judge(step2, win, [tie], worse) is None and step2.adopted is None and step2.gain is None


def test_a_step_adopts_a_candidate_only_when_it_beats_the_incumbent_with_confidence() -> None:
    by_name = {"baseline": [100.0, 102.0, 99.0, 101.0], "max_num_seqs=4": [160.0, 163.0, 158.0, 161.0]}
    out = judge_step(race_state(by_name, maximize=True, margin=0.05, reference=4), "baseline")
    assert out.adopted == "max_num_seqs=4" and out.comparison is not None
    assert "adopted: +60%" in out.words


def test_a_stop_after_an_undecided_lever_says_what_would_decide_it() -> None:
    step = Step(3, "enable_prefix_caching=true", "limited by batch slots (strong)", ["batch_slots"])
    assert undecided_hint(step) == ""
    step.passed_undecided = True  # set where a lever is passed over whose race was undecided
    assert "objective.max_repeats=auto" in undecided_hint(step)


def ttft(name: str, values: list[float]) -> TrialData:
    made = [TrialData(name, "FINISHED", {}, {"ttft_ms_p50": v}, [], round=r) for r, v in enumerate(values)]
    return dataclasses.replace(made[0], runs=made[1:])


def test_a_second_look_continues_the_first_race_to_the_runs_its_noise_asks_for() -> None:
    # the benchmark's step 2 (docs/runs/benchmarks.md): 8 slots against 4 at the edge of capacity
    objective = ObjectiveSpec(minimize="ttft_ms_p50", max_repeats=3)
    step2 = {"seqs4": ttft("seqs4", [3518.0, 5320.0, 5407.0]), "seqs8": ttft("seqs8", [2036.0, 1835.0, 3683.0])}
    state = race_over(list(step2.values()), objective)
    first = judge_step(state, "seqs4", "ttft_ms_p50")
    assert first.adopted is None and first.led_undecided == "seqs8" and "undecided" in first.words
    need = state.runs_to_decide("seqs4")
    assert need is not None and need > 3  # the noise measured asks for more runs than the cap allowed
    tried = RacedBefore(2, first.words, "inc", undecided=True, led=True, runs=3, need=need)
    # continued with step 2's requests (its trial hashes: the 3 runs each read back) up to `need`
    assert tried.continued() == (2, [f"++objective.max_repeats={need}", f"++objective.budget={need - 3 + 0.5:g}"])
    again = Candidate("seqs8", {"engine.max_num_seqs": 8}, None, tried)
    assert continued_race([Candidate("x", {}), again]) is tried
    assert continued_race([Candidate("x", {})]) is None
    assert continued_race([Candidate("y", {}, None, dataclasses.replace(tried, need=None))]) is None
    # the same race two rounds on (values made up: 8 slots ahead in both): its 5 runs each decide it
    longer = {
        "seqs4": ttft("seqs4", [3518.0, 5320.0, 5407.0, 4915.0, 3473.0]),
        "seqs8": ttft("seqs8", [2036.0, 1835.0, 3683.0, 2047.0, 1571.0]),
    }
    decided = judge_step(
        race_over(list(longer.values()), ObjectiveSpec(minimize="ttft_ms_p50", max_repeats=need)),
        "seqs4",
        "ttft_ms_p50",
    )
    assert decided.adopted == "seqs8" and decided.comparison is not None
    assert decided.comparison.outcome == Outcome.BETTER


def test_a_second_look_only_for_a_leader_undecided_beside_the_same_incumbent_and_only_once() -> None:
    led = RacedBefore(2, "the incumbent stays: x ..., undecided", "inc", undecided=True, led=True)
    assert led.second_look("inc")
    assert not led.second_look("another incumbent")
    assert not RacedBefore(2, "...", "inc", undecided=True, led=False).second_look("inc")  # it trailed
    assert not RacedBefore(2, "...", "inc", undecided=False, led=True).second_look("inc")  # a tie or worse: a "no"
    assert not dataclasses.replace(led, looks=2).second_look("inc")  # its second look was undecided too
