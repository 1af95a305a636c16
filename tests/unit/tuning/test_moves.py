"""The tuner's lever table and moves: the table and a user's rows, what a lever proposes from a
configuration within a space, two causes' moves made together (orchestrator.tuning.levers,
.space, .moves)."""

from __future__ import annotations

import pytest

from orchestrator.config.errors import ConfigError
from orchestrator.config.schema import ObjectiveSpec
from orchestrator.metrics.diagnosis import Evidence
from orchestrator.tuning.candidates import hydra_value, name_of, tunable
from orchestrator.tuning.levers import CAUSES, Lever, load_levers
from orchestrator.tuning.moves import STALL_BUDGET_MIN, Proposal, Start, combined, propose, stall_budget
from orchestrator.tuning.space import Space, check_space


def lever(**change: dict) -> Lever:
    return Lever.model_validate({"name": "l", "change": change})


def at(current: dict, space: Space | None = None, platform: str = "cpu", guards: bool = False) -> Start:
    """A move's start: a vLLM configuration with these knobs, the space (every knob by default)."""
    return Start(current, space or Space.of(None), "vllm", platform, guards)


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
    p = propose("batch_slots", lever(**{"engine.max_num_seqs": {"times": 2}}), at({"engine.max_num_seqs": 3}))
    assert p.values == {"engine.max_num_seqs": 6} and not p.skip
    assert p.words({"engine.max_num_seqs": 3}) == "max_num_seqs 3 -> 6"


def test_a_listed_knob_moves_to_the_next_listed_value_and_stops_at_the_end() -> None:
    space = Space.of({"engine.max_num_seqs": [1, 4, 16]})
    up = lever(**{"engine.max_num_seqs": {"times": 2}})
    assert propose("batch_slots", up, at({"engine.max_num_seqs": 4}, space)).values == {"engine.max_num_seqs": 16}
    end = propose("batch_slots", up, at({"engine.max_num_seqs": 16}, space))
    assert "end of the space" in end.skip
    down = lever(**{"engine.max_num_batched_tokens": {"times": 0.5}})
    written_high_first = Space.of({"engine.max_num_batched_tokens": [2048, 512, 1024]})
    current = {"engine.max_num_batched_tokens": 2048}
    assert propose("p", down, at(current, written_high_first)).values == {"engine.max_num_batched_tokens": 1024}


def test_a_range_bounds_a_move() -> None:
    space = Space.of({"engine.max_num_seqs": {"min": 1, "max": 5}})
    up = lever(**{"engine.max_num_seqs": {"times": 2}})
    assert propose("b", up, at({"engine.max_num_seqs": 4}, space)).values == {"engine.max_num_seqs": 5}
    assert "bound" in propose("b", up, at({"engine.max_num_seqs": 5}, space)).skip


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
    p = propose("c", Lever.model_validate({"name": "l", **row}), at(current, Space.of(space)))
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
    p = propose("c", Lever.model_validate(row), at(off, space))
    assert p.values == {"engine.enable_chunked_prefill": True, "engine.max_num_batched_tokens": 1024}
    assert p.words(off) == "enable_chunked_prefill false -> true, max_num_batched_tokens 2048 -> 1024"


def test_a_stall_move_sizes_the_budget_from_the_stalls_cost_per_token() -> None:
    # stalls of a decode step of 9 ms plus 0.5 ms per prefill token: a chunk stalling about 4 steps
    # holds (4 - 1) x 9 / 0.5 = 54 tokens
    seen = Evidence(decode_step_ms=9.0, prefill_stall_ms_per_token=0.5)
    assert stall_budget(seen, 4) == pytest.approx(54.0)
    row = Lever.model_validate({"name": "sized", "change": {"engine.max_num_batched_tokens": {"stall": 4}}})
    now = {"engine.max_num_batched_tokens": 2048}

    def moved(space, evidence=seen):
        return propose("c", row, at(now, space), evidence)

    listed = Space.of(None, {"engine.max_num_batched_tokens": [2048, 1024, 512, 256]})
    assert moved(listed).values == {"engine.max_num_batched_tokens": 256}  # the listed value nearest 54 by ratio
    assert moved(Space.of(None)).values == {"engine.max_num_batched_tokens": STALL_BUDGET_MIN}
    wide = Evidence(decode_step_ms=9.0, prefill_stall_ms_per_token=0.01)  # cheap prefill: 2700 tokens
    assert "already keeps a chunk's stall within 4 decode steps" in moved(Space.of(None), wide).skip
    assert "no stall cost" in moved(Space.of(None), Evidence()).skip


def test_a_draft_head_lever_applies_to_its_model() -> None:
    row = {"name": "eagle", "change": {"engine.speculative_config": {"to": {"method": "eagle"}}}, "models": ["m"]}
    p = propose("c", Lever.model_validate(row), at({"model.name": "m"}, platform="gpu"))
    assert p.values == {"engine.speculative_config": {"method": "eagle"}} and not p.skip


def test_an_accuracy_lever_applies_under_an_accuracy_constraint() -> None:
    guarded = ObjectiveSpec(maximize="tokens_per_second", subject_to={"accuracy": 0.8})
    row = Lever.model_validate({"name": "fp8", "change": {"engine.kv_cache_dtype": {"to": "fp8"}}, "accuracy": True})
    assert propose("kv_capacity", row, at({}, platform="gpu", guards=guarded.guards_accuracy)).values == {
        "engine.kv_cache_dtype": "fp8"
    }


@pytest.mark.parametrize(
    "constraint, guards",
    [
        ("accuracy", True),
        ("eval_gsm8k_exact_match_strict_match", True),  # an lm-eval task's metric
        ("adapters_kept_min", True),  # the LoRA adapters' served accuracy against their own
        ("adapter.lora-a.accuracy", True),
        ("ttft_ms_p99", False),
        ("long/itl_ms_p99", False),
        ("server_prefix_cache_hit_rate", False),  # a rate, though not a latency: no answer is scored
    ],
)
def test_an_objective_guards_accuracy_by_the_metrics_it_constrains(constraint: str, guards: bool) -> None:
    objective = ObjectiveSpec(maximize="tokens_per_second", subject_to={constraint: {"min": 0.5}})
    assert objective.guards_accuracy is guards


def test_a_space_entry_that_is_neither_a_list_nor_a_range_is_refused() -> None:
    with pytest.raises(ConfigError, match="hydra.sweeper.space.engine.max_num_seqs"):
        Space.of({"engine.max_num_seqs": 8})
    with pytest.raises(ConfigError, match="no key"):
        Space.of({"engine.max_num_seqz": [1, 2]})
    with pytest.raises(ConfigError, match="the command line: engine.max_num_seqz is no key"):
        Space.of(None, {"engine.max_num_seqz": [1, 2]})


def test_override_values_read_back_as_hydra_reads_them() -> None:
    assert hydra_value(True) == "true" and hydra_value(None) == "null" and hydra_value(0.5) == "0.5"
    assert hydra_value({"method": "ngram", "num_speculative_tokens": 3}) == "{method:ngram,num_speculative_tokens:3}"
    assert (
        name_of({"engine.max_num_seqs": 4, "engine.enable_chunked_prefill": True})
        == "max_num_seqs=4,enable_chunked_prefill=true"
    )


def test_a_demand_move_takes_the_slots_the_finding_saw_as_the_space_allows() -> None:
    row = Lever.model_validate({"name": "demand", "change": {"engine.max_num_seqs": {"demand": True}}})
    seen = Evidence(running_max=1.0, waiting_max=30.0)
    listed = Space.of({"engine.max_num_seqs": [1, 2, 4, 8, 16, 64]})
    p = propose("batch_slots", row, at({"engine.max_num_seqs": 1}, listed), seen)
    assert p.values == {"engine.max_num_seqs": 64}  # the smallest listed value that holds 31
    ranged = Space.of({"engine.max_num_seqs": {"min": 1, "max": 16}})
    assert propose("b", row, at({"engine.max_num_seqs": 1}, ranged), seen).values == {"engine.max_num_seqs": 16}
    assert "no demand" in propose("b", row, at({"engine.max_num_seqs": 1}, listed)).skip


def test_a_space_no_lever_touches_and_a_knob_objective_are_refused_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match="no lever moves any of its knobs"):
        check_space(Space.of({"engine.block_size": [16, 32]}), load_levers())
    check_space(Space.of({"engine.max_num_seqs": [1, 2]}), load_levers())  # a lever moves it
    with pytest.raises(ConfigError, match="is a knob; the tuner needs a measured metric"):
        tunable(ObjectiveSpec(minimize="engine.max_num_batched_tokens"))


def test_two_causes_moves_on_different_knobs_are_also_tried_together() -> None:
    slots = Proposal(("over_capacity",), lever(**{"engine.max_num_seqs": {"times": 2}}), {"engine.max_num_seqs": 8})
    cache = Proposal(
        ("prefix_reuse_missed",),
        lever(**{"engine.enable_prefix_caching": {"to": True}}),
        {"engine.enable_prefix_caching": True},
    )
    both = combined(slots, cache)
    assert both is not None and both.values == {"engine.max_num_seqs": 8, "engine.enable_prefix_caching": True}
    assert both.cause == "over_capacity+prefix_reuse_missed" and set(both.lever.change) == set(both.values)
    assert both.words({"engine.max_num_seqs": 4, "engine.enable_prefix_caching": False}) == (
        "max_num_seqs 4 -> 8, enable_prefix_caching false -> true"
    )
    same_cause = Proposal(("over_capacity",), cache.lever, cache.values)
    assert combined(slots, same_cause) is None  # one cause: its moves are alternatives
    same_knob = Proposal(("batch_slots",), slots.lever, {"engine.max_num_seqs": 16})
    assert combined(slots, same_knob) is None  # one knob cannot take two values
    assert combined(slots, Proposal(("kv_capacity",), cache.lever, {}, "passed over")) is None
    assert combined(slots, None) is None
