"""The tuner's pure parts: the lever table, what a lever proposes within a space, the causes it
acts on, and when a step's race adopts a candidate (orchestrator.decide.levers / tune)."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.config.errors import ConfigError
from orchestrator.config.schema import ObjectiveSpec
from orchestrator.decide.levers import CAUSES, STALL_BUDGET_MIN, Lever, Space, load_levers, propose, stall_budget
from orchestrator.decide.race import race_state
from orchestrator.decide.trials import Point, TrialData
from orchestrator.decide.tune import causes_of, gain, judge_step
from orchestrator.scheduling.tuning_knobs import hydra_value, name_of

THROUGHPUT = ObjectiveSpec(maximize="tokens_per_second")


def lever(**change: dict) -> Lever:
    return Lever.model_validate({"name": "l", "change": change})


def test_the_default_table_loads_and_names_known_causes() -> None:
    table = load_levers()
    assert set(table) <= set(CAUSES)
    assert table["batch_slots"][1].change["engine.max_num_seqs"].times == 2
    assert "prefix_reuse_missed" in table


def test_a_users_file_replaces_a_causes_rows_and_keeps_the_others(tmp_path) -> None:
    f = tmp_path / "mine.yaml"
    f.write_text("batch_slots:\n  - {name: four times, change: {engine.max_num_seqs: {times: 4}}}\n")
    table = load_levers(f)
    assert [x.name for x in table["batch_slots"]] == ["four times"]
    assert table["kv_capacity"] == load_levers()["kv_capacity"]


@pytest.mark.parametrize(
    "text, said",
    [
        (
            "batch_slots:\n  - {name: x, change: {engine.max_num_seqz: {times: 2}}}\n",
            "engine.max_num_seqz is no engine knob",
        ),
        ("slow_disks:\n  - {name: x, change: {engine.max_num_seqs: {times: 2}}}\n", "'slow_disks' is no cause"),
        ("batch_slots:\n  - {name: x, change: {engine.max_num_seqs: {times: 2, plus: 1}}}\n", "exactly one of"),
        ("batch_slots: 3\n", "expected a list of moves"),
    ],
)
def test_a_bad_lever_file_is_refused_naming_the_file_and_row(tmp_path, text: str, said: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_levers(f)
    assert said in str(err.value) and "bad.yaml" in str(err.value)


def test_a_relative_move_steps_from_the_current_value() -> None:
    p = propose(
        "batch_slots",
        lever(**{"engine.max_num_seqs": {"times": 2}}),
        {"engine.max_num_seqs": 3},
        Space.of(None),
        "vllm",
        "cpu",
        THROUGHPUT,
    )
    assert p.values == {"engine.max_num_seqs": 6} and not p.skip
    assert p.words({"engine.max_num_seqs": 3}) == "max_num_seqs 3 -> 6"


def test_a_listed_knob_moves_to_the_next_listed_value_and_stops_at_the_end() -> None:
    space = Space.of({"engine.max_num_seqs": [1, 4, 16]})
    up = lever(**{"engine.max_num_seqs": {"times": 2}})
    assert propose("batch_slots", up, {"engine.max_num_seqs": 4}, space, "vllm", "cpu", THROUGHPUT).values == {
        "engine.max_num_seqs": 16
    }
    end = propose("batch_slots", up, {"engine.max_num_seqs": 16}, space, "vllm", "cpu", THROUGHPUT)
    assert "end of the space" in end.skip
    down = lever(**{"engine.max_num_batched_tokens": {"times": 0.5}})
    written_high_first = Space.of({"engine.max_num_batched_tokens": [2048, 512, 1024]})
    current = {"engine.max_num_batched_tokens": 2048}
    assert propose("p", down, current, written_high_first, "vllm", "cpu", THROUGHPUT).values == {
        "engine.max_num_batched_tokens": 1024
    }


def test_a_range_bounds_a_move() -> None:
    space = Space.of({"engine.max_num_seqs": {"min": 1, "max": 5}})
    up = lever(**{"engine.max_num_seqs": {"times": 2}})
    assert propose("b", up, {"engine.max_num_seqs": 4}, space, "vllm", "cpu", THROUGHPUT).values == {
        "engine.max_num_seqs": 5
    }
    assert "bound" in propose("b", up, {"engine.max_num_seqs": 5}, space, "vllm", "cpu", THROUGHPUT).skip


@pytest.mark.parametrize(
    "row, current, space, why",
    [
        ({"change": {"engine.max_num_seqs": {"times": 2}}}, {}, None, "unset"),
        (
            {"change": {"engine.max_num_seqs": {"times": 2}}, "engine": "sglang"},
            {"engine.max_num_seqs": 2},
            None,
            "a sglang lever",
        ),
        ({"change": {"engine.kv_cache_dtype": {"to": "fp8"}}, "platform": "gpu"}, {}, None, "a gpu lever"),
        ({"change": {"engine.kv_cache_dtype": {"to": "fp8"}}, "accuracy": True}, {}, None, "no accuracy constraint"),
        (
            {
                "change": {"engine.max_num_batched_tokens": {"times": 0.5}},
                "requires": {"engine.enable_chunked_prefill": True},
            },
            {"engine.max_num_batched_tokens": 512},
            {"engine.max_num_batched_tokens": [256, 512]},
            "needs engine.enable_chunked_prefill=true, which the search space does not allow",
        ),
        (
            {"change": {"engine.max_num_seqs": {"times": 2}}},
            {"engine.max_num_seqs": 2},
            {"engine.block_size": [16, 32]},
            "not in the search space",
        ),
        (
            {"change": {"engine.enable_prefix_caching": {"to": True}}},
            {"engine.enable_prefix_caching": True},
            None,
            "changes nothing",
        ),
        ({"change": {"engine.disable_radix_cache": {"to": False}}}, {}, None, "vllm has no engine.disable_radix_cache"),
        (
            {"change": {"engine.speculative_config": {"to": {"method": "eagle"}}}, "models": ["big-model"]},
            {"model.name": "tiny-llama"},
            None,
            "a lever for big-model (the model is tiny-llama)",
        ),
    ],
)
def test_a_lever_that_cannot_apply_is_passed_over_with_its_reason(row, current, space, why) -> None:
    p = propose("c", Lever.model_validate({"name": "l", **row}), current, Space.of(space), "vllm", "cpu", THROUGHPUT)
    assert why in p.skip and not p.values


def test_a_setting_a_move_needs_is_set_with_it_where_the_space_allows() -> None:
    row = {
        "name": "smaller chunks",
        "change": {"engine.max_num_batched_tokens": {"times": 0.5}},
        "requires": {"engine.enable_chunked_prefill": True},
    }
    off = {"engine.enable_chunked_prefill": False, "engine.max_num_batched_tokens": 2048}
    space = Space.of(
        None, {"engine.enable_chunked_prefill": [False, True], "engine.max_num_batched_tokens": [2048, 1024]}
    )
    p = propose("c", Lever.model_validate(row), off, space, "vllm", "cpu", THROUGHPUT)
    assert p.values == {"engine.enable_chunked_prefill": True, "engine.max_num_batched_tokens": 1024}
    assert p.words(off) == "enable_chunked_prefill false -> true, max_num_batched_tokens 2048 -> 1024"


def test_a_stall_move_sizes_the_budget_from_the_stalls_cost_per_token() -> None:
    # stalls of a decode step of 9 ms plus 0.5 ms per prefill token: a chunk stalling about 4 steps
    # holds (4 - 1) x 9 / 0.5 = 54 tokens
    seen = {"decode_step_ms": 9.0, "prefill_stall_ms_per_token": 0.5}
    assert stall_budget(seen, 4) == pytest.approx(54.0)
    row = Lever.model_validate({"name": "sized", "change": {"engine.max_num_batched_tokens": {"stall": 4}}})
    now = {"engine.max_num_batched_tokens": 2048}

    def moved(space, evidence=seen):
        return propose("c", row, now, space, "vllm", "cpu", THROUGHPUT, evidence)

    listed = Space.of(None, {"engine.max_num_batched_tokens": [2048, 1024, 512, 256]})
    assert moved(listed).values == {"engine.max_num_batched_tokens": 256}  # the listed value nearest 54 by ratio
    assert moved(Space.of(None)).values == {"engine.max_num_batched_tokens": STALL_BUDGET_MIN}
    wide = {"decode_step_ms": 9.0, "prefill_stall_ms_per_token": 0.01}  # cheap prefill: 2700 tokens
    assert "already keeps a chunk's stall within 4 decode steps" in moved(Space.of(None), wide).skip
    assert "no stall cost" in moved(Space.of(None), {}).skip


def test_a_draft_head_lever_applies_to_its_model() -> None:
    row = {"name": "eagle", "change": {"engine.speculative_config": {"to": {"method": "eagle"}}}, "models": ["m"]}
    p = propose("c", Lever.model_validate(row), {"model.name": "m"}, Space.of(None), "vllm", "gpu", THROUGHPUT)
    assert p.values == {"engine.speculative_config": {"method": "eagle"}} and not p.skip


def test_an_accuracy_lever_applies_under_an_accuracy_constraint() -> None:
    guarded = ObjectiveSpec(maximize="tokens_per_second", subject_to={"accuracy": 0.8})
    row = Lever.model_validate({"name": "fp8", "change": {"engine.kv_cache_dtype": {"to": "fp8"}}, "accuracy": True})
    assert propose("kv_capacity", row, {}, Space.of(None), "vllm", "gpu", guarded).values == {
        "engine.kv_cache_dtype": "fp8"
    }


def test_a_space_entry_that_is_neither_a_list_nor_a_range_is_refused() -> None:
    with pytest.raises(ConfigError, match="hydra.sweeper.space.engine.max_num_seqs"):
        Space.of({"engine.max_num_seqs": 8})
    with pytest.raises(ConfigError, match="no key"):
        Space.of({"engine.max_num_seqz": [1, 2]})
    with pytest.raises(ConfigError, match="the command line: engine.max_num_seqz is no key"):
        Space.of(None, {"engine.max_num_seqz": [1, 2]})


def point(diagnosis: dict, metrics: dict | None = None) -> Point:
    return Point(0, "c4", {"concurrency": 4}, metrics or {}, diagnosis=diagnosis)


def test_the_causes_start_with_the_limiter_and_leave_out_the_client_and_none() -> None:
    p = point(
        {
            "limiter": "batch_slots",
            "findings": [
                {"cause": "prefill_interference", "confidence": "weak", "detail": "2 stalls"},
                {"cause": "batch_slots", "confidence": "strong", "detail": "up to 6 waited while 2 ran"},
                {"cause": "client", "confidence": "weak", "detail": ""},
            ],
        }
    )
    causes = causes_of(p)
    assert [c.cause for c in causes] == ["batch_slots", "prefill_interference"]
    assert causes[0].words() == "batch slots (strong: up to 6 waited while 2 ran)"


def test_a_step_adopts_a_candidate_only_when_it_beats_the_incumbent_with_confidence() -> None:
    runs = {"baseline": [100.0, 102.0, 99.0, 101.0], "max_num_seqs=4": [160.0, 163.0, 158.0, 161.0]}
    state = race_state(runs, maximize=True, margin=0.05, reference=4)
    out = judge_step(state, "baseline")
    assert out.adopted == "max_num_seqs=4" and out.comparison is not None
    mid, lo, hi = gain(out.comparison)
    assert lo < mid < hi and 0.5 < mid < 0.7
    assert "adopted: +60%" in out.words


def test_a_tie_or_a_leading_incumbent_keeps_the_incumbent() -> None:
    tie = {"baseline": [100.0, 101.0, 99.0, 100.5], "x": [100.2, 100.8, 99.5, 100.1]}
    out = judge_step(race_state(tie, maximize=True, margin=0.1, reference=4), "baseline")
    assert out.adopted is None and "the incumbent stays" in out.words
    worse = {"baseline": [100.0, 101.0, 99.0, 100.5], "x": [70.0, 71.0, 69.0, 70.5]}
    out = judge_step(race_state(worse, maximize=True, margin=0.05, reference=4), "baseline")
    assert out.adopted is None and "-30%" in out.words


def test_override_values_read_back_as_hydra_reads_them() -> None:
    assert hydra_value(True) == "true" and hydra_value(None) == "null" and hydra_value(0.5) == "0.5"
    assert hydra_value({"method": "ngram", "num_speculative_tokens": 3}) == "{method:ngram,num_speculative_tokens:3}"
    assert (
        name_of({"engine.max_num_seqs": 4, "engine.enable_chunked_prefill": True})
        == "max_num_seqs=4,enable_chunked_prefill=true"
    )


def test_a_demand_move_takes_the_slots_the_finding_saw_as_the_space_allows() -> None:
    row = Lever.model_validate({"name": "demand", "change": {"engine.max_num_seqs": {"demand": True}}})
    seen = {"running_max": 1.0, "waiting_max": 30.0}
    listed = Space.of({"engine.max_num_seqs": [1, 2, 4, 8, 16, 64]})
    p = propose("batch_slots", row, {"engine.max_num_seqs": 1}, listed, "vllm", "cpu", THROUGHPUT, seen)
    assert p.values == {"engine.max_num_seqs": 64}  # the smallest listed value that holds 31
    ranged = Space.of({"engine.max_num_seqs": {"min": 1, "max": 16}})
    assert propose("b", row, {"engine.max_num_seqs": 1}, ranged, "vllm", "cpu", THROUGHPUT, seen).values == {
        "engine.max_num_seqs": 16
    }
    assert "no demand" in propose("b", row, {"engine.max_num_seqs": 1}, listed, "vllm", "cpu", THROUGHPUT).skip


def test_a_space_no_lever_touches_and_a_knob_objective_are_refused_before_anything_starts() -> None:
    from orchestrator.scheduling.tuning_knobs import check_space, tunable

    with pytest.raises(ConfigError, match="no lever moves any of its knobs"):
        check_space(Space.of({"engine.block_size": [16, 32]}), load_levers())
    check_space(Space.of({"engine.max_num_seqs": [1, 2]}), load_levers())  # a lever moves it
    with pytest.raises(ConfigError, match="is a knob; the tuner needs a measured metric"):
        tunable(ObjectiveSpec(minimize="engine.max_num_batched_tokens"))


def test_a_stop_after_an_undecided_lever_says_what_would_decide_it():
    from orchestrator.decide.tune import Step, undecided_hint

    step = Step(3, "enable_prefix_caching=true", "limited by batch slots (strong)", ["batch_slots"])
    assert undecided_hint(step) == ""
    step.passed_undecided = True  # set where a lever is passed over whose race was undecided
    assert "objective.max_repeats=auto" in undecided_hint(step)


def ttft(name: str, values: list[float]) -> TrialData:
    """A configuration's runs in one step's launch: its first pass and the race's repeats, by round."""
    runs = [TrialData(name, "FINISHED", {}, {"ttft_ms_p50": v}, [], round=r) for r, v in enumerate(values)]
    return dataclasses.replace(runs[0], runs=runs[1:])


def test_a_second_look_continues_the_first_race_to_the_runs_its_noise_asks_for() -> None:
    from orchestrator.decide.verdict import race_over
    from orchestrator.scheduling.tuning_knobs import Candidate, Tried, continued_race

    # the benchmark's step 2 (docs/tuning.md): 8 slots against 4 at the edge of capacity, 3 runs each
    objective = ObjectiveSpec(minimize="ttft_ms_p50", max_repeats=3)
    step2 = {"seqs4": ttft("seqs4", [3518.0, 5320.0, 5407.0]), "seqs8": ttft("seqs8", [2036.0, 1835.0, 3683.0])}
    state = race_over(list(step2.values()), objective)
    first = judge_step(state, "seqs4", "ttft_ms_p50")
    assert first.adopted is None and first.led_undecided == "seqs8" and "undecided" in first.words
    need = state.runs_to_decide("seqs4")
    assert need is not None and need > 3  # the noise measured asks for more runs than the cap allowed
    tried = Tried(2, first.words, "inc", undecided=True, led=True, runs=3, need=need)
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
    assert decided.adopted == "seqs8" and decided.comparison is not None and decided.comparison.outcome == "better"


def test_a_second_look_only_for_a_leader_undecided_beside_the_same_incumbent_and_only_once() -> None:
    from orchestrator.scheduling.tuning_knobs import Tried

    led = Tried(2, "the incumbent stays: x ..., undecided", "inc", undecided=True, led=True)
    assert led.second_look("inc")
    assert not led.second_look("another incumbent")
    assert not Tried(2, "...", "inc", undecided=True, led=False).second_look("inc")  # it trailed
    assert not Tried(2, "...", "inc", undecided=False, led=True).second_look("inc")  # a tie or worse: a "no"
    assert not dataclasses.replace(led, looks=2).second_look("inc")  # its second look was undecided too


def test_a_second_look_is_passed_over_where_no_number_of_runs_or_the_budget_decides_it() -> None:
    from orchestrator.decide.tune import Step
    from orchestrator.scheduling.tuning import Tuner
    from orchestrator.scheduling.tuning_knobs import Candidate, Tried

    tuner = object.__new__(Tuner)  # passed() alone: no Hydra, no launcher
    tuner.trials_run, tuner.max_trials, tuner.max_wall_s = 10, 20, None
    tuner.started = 0.0
    step, inc = Step(3, "inc", "", []), Candidate("inc", {})
    led = Tried(2, "the incumbent stays: ..., undecided", identity := "{}", undecided=True, led=True, runs=3, need=6)
    assert tuner.passed(step, "x", led, [], inc) == ""  # 6 more runs fit in the 10 left
    assert "no practical number of runs" in tuner.passed(step, "x", dataclasses.replace(led, need=None), [], inc)
    said = tuner.passed(step, "x", dataclasses.replace(led, need=12), [], inc)
    assert "deciding needs 12 runs each" in said and "max_trials 20" in said
    assert tuner.passed(step, "x", dataclasses.replace(led, looks=2), [], inc).startswith("tried already")
    assert step.passed_undecided and identity == "{}"


def test_two_causes_moves_on_different_knobs_are_also_tried_together() -> None:
    from orchestrator.decide.levers import Proposal, combined

    slots = Proposal("over_capacity", lever(**{"engine.max_num_seqs": {"times": 2}}), {"engine.max_num_seqs": 8})
    cache = Proposal(
        "prefix_reuse_missed",
        lever(**{"engine.enable_prefix_caching": {"to": True}}),
        {"engine.enable_prefix_caching": True},
    )
    both = combined(slots, cache)
    assert both is not None and both.values == {"engine.max_num_seqs": 8, "engine.enable_prefix_caching": True}
    assert both.cause == "over_capacity+prefix_reuse_missed" and set(both.lever.change) == set(both.values)
    assert both.words({"engine.max_num_seqs": 4, "engine.enable_prefix_caching": False}) == (
        "max_num_seqs 4 -> 8, enable_prefix_caching false -> true"
    )
    same_cause = Proposal("over_capacity", cache.lever, cache.values)
    assert combined(slots, same_cause) is None  # one cause: its moves are alternatives
    same_knob = Proposal("batch_slots", slots.lever, {"engine.max_num_seqs": 16})
    assert combined(slots, same_knob) is None  # one knob cannot take two values
    assert combined(slots, Proposal("kv_capacity", cache.lever, {}, "passed over")) is None
    assert combined(slots, None) is None
