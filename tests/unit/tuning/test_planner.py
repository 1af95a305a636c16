"""What a step tries (orchestrator.tuning.planner), over scripted diagnoses: each cause takes its
own levers, the limiter's first; the client's and a shared machine's findings are never acted on;
a space that leaves a knob out passes its moves over, with the reason; a configuration raced
before is passed over unless its race was undecided with it in the lead (a second look)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest

from orchestrator.decide.trials import Point
from orchestrator.metrics.diagnosis import Evidence, Finding, LoggedDiagnosis
from orchestrator.tuning.candidates import Candidate, RacedBefore
from orchestrator.tuning.levers import load_levers
from orchestrator.tuning.planner import Planner, Policy, causes_of
from orchestrator.tuning.space import Space

# the incumbent: 4 batch slots, prefix caching off, chunked prefill on with a 2048-token budget
BASE = {
    "engine.max_num_seqs": 4,
    "engine.enable_prefix_caching": False,
    "engine.enable_chunked_prefill": True,
    "engine.max_num_batched_tokens": 2048,
    "engine.cpu_kvcache_space_gib": 4,
    "model.name": "tiny-llama",
}
SLOTS = Finding(
    "batch_slots",
    "strong",
    "4 of max_num_seqs 4 running while up to 12 waited",
    Evidence(running_max=4, waiting_max=12),
)
REUSE = Finding(
    "prefix_reuse_missed",
    "strong",
    "the prompts share 90% of their tokens, and the server's prefix cache is off",
    Evidence(prefix_reuse_ideal_share=0.9),
)
STALLS = Finding(
    "prefill_interference",
    "weak",
    "12 gaps fell during another request's prefill",
    Evidence(decode_step_ms=10.0, prefill_stall_ms_per_token=0.2),
)
CLIENT = Finding("client", "strong", "the client read late")
SHARED = Finding("shared_machine", "strong", "1.2 cores busy outside the trial")
NONE = Finding("none", "strong", "the server had headroom")


class Configs:
    """The incumbent's knobs with a move's on top; ``refuse``: knobs whose configuration cannot run."""

    def __init__(self, refuse: Mapping[str, Any] | None = None) -> None:
        self.refuse = dict(refuse or {})

    def knobs(self, knobs: Mapping[str, Any]) -> dict[str, Any]:
        return {**BASE, **knobs}

    def refused(self, knobs: Mapping[str, Any]) -> str:
        hit = [k for k, v in self.refuse.items() if knobs.get(k) == v]
        return f"the engine refuses {hit[0]}={self.refuse[hit[0]]}" if hit else ""


class Budget:
    def __init__(self, left: int = 40) -> None:
        self.left = left

    def over(self, trials: int) -> str:
        return "" if trials <= self.left else f"max_trials: {self.left} runs left, {trials} needed"


def planner(space: dict[str, list[Any]] | None = None, per_step: int = 2, combine: bool = True, **kw: Any) -> Planner:
    """A vLLM planner on the CPU with the default lever table; ``space``: the knobs it may move
    (None: every knob a lever names)."""
    policy = Policy(load_levers(), Space.of(space), "vllm", "cpu", False, per_step, combine)
    return Planner(policy, kw.pop("configs", Configs()), kw.pop("budget", Budget()), **kw)


def diagnosed(limiter: str, *findings: Finding) -> Point:
    d = LoggedDiagnosis(limiter, "strong", f"limited by {limiter.replace('_', ' ')}", "", tuple(findings))
    return Point(0, "c8", {"concurrency": 8}, {}, diagnosis=d)


def tried(step) -> list[tuple[str, str]]:
    return [(t.cause, t.lever) for t in step.tried]


# batch slots' moves reach one configuration in this space (16 slots), prefix caching another
BOTH = {"engine.max_num_seqs": [4, 16], "engine.enable_prefix_caching": [False, True]}


def test_the_limiters_lever_is_tried_first_whatever_the_tables_order() -> None:
    """The table lists batch slots first; the diagnosis says prefix reuse limited the point: one
    candidate a step, it is prefix caching (a tuner taking the table's first lever fails here)."""
    step, chosen = planner(BOTH, per_step=1).next_step(
        1, Candidate("baseline", {}), diagnosed("prefix_reuse_missed", SLOTS, REUSE)
    )
    assert tried(step) == [("prefix_reuse_missed", "prefix caching")]
    assert [c.knobs for c in chosen] == [{"engine.enable_prefix_caching": True}]
    assert step.causes == ["prefix_reuse_missed", "batch_slots"] and step.headline == "limited by prefix reuse missed"


def test_each_cause_takes_its_own_levers_and_two_causes_moves_are_also_raced_together() -> None:
    step, chosen = planner(BOTH).next_step(1, Candidate("baseline", {}), diagnosed("batch_slots", REUSE, SLOTS))
    # the limiter's own first move reads its evidence (4 running + 12 waiting: 16 slots); its other
    # moves reach the same configuration here, so the next cause's move is the second candidate,
    # and the third is both together
    assert ("batch_slots", "more batch slots", "proposed already in this step") in [
        (p.cause, p.lever, p.why) for p in step.passed_over
    ]
    assert tried(step) == [
        ("batch_slots", "batch slots for the demand seen"),
        ("prefix_reuse_missed", "prefix caching"),
        ("batch_slots+prefix_reuse_missed", "batch slots for the demand seen with prefix caching"),
    ]
    assert [c.knobs for c in chosen] == [
        {"engine.max_num_seqs": 16},
        {"engine.enable_prefix_caching": True},
        {"engine.max_num_seqs": 16, "engine.enable_prefix_caching": True},
    ]
    assert step.tried[0].change == "max_num_seqs 4 -> 16"
    alone, _ = planner(BOTH, combine=False).next_step(
        1, Candidate("baseline", {}), diagnosed("batch_slots", REUSE, SLOTS)
    )
    assert len(alone.tried) == 2


def test_the_stall_cause_sizes_its_own_budget_from_its_evidence() -> None:
    space = {"engine.max_num_batched_tokens": [2048, 1024, 512, 256], "engine.max_num_seqs": [4, 8]}
    step, chosen = planner(space, per_step=1).next_step(
        1, Candidate("baseline", {}), diagnosed("prefill_interference", STALLS, SLOTS)
    )
    # (4 - 1) x 10 ms / 0.2 ms per token = 150 tokens: the listed budget nearest it by ratio
    assert tried(step) == [("prefill_interference", "prefill chunks sized to the stalls")]
    assert chosen[0].knobs == {"engine.max_num_batched_tokens": 256}


@pytest.mark.parametrize("outside", [CLIENT, SHARED])
def test_the_client_a_shared_machine_and_none_are_never_acted_on(outside: Finding) -> None:
    step, chosen = planner().next_step(1, Candidate("baseline", {}), diagnosed(outside.cause, outside, NONE))
    assert chosen == [] and step.tried == [] and step.causes == []
    assert causes_of(LoggedDiagnosis(outside.cause, findings=(outside, SLOTS, NONE))) == [SLOTS]


def test_a_space_that_leaves_a_knob_out_passes_its_moves_over_with_the_reason() -> None:
    only_slots = {"engine.max_num_seqs": [4, 8]}
    step, chosen = planner(only_slots).next_step(
        1, Candidate("baseline", {}), diagnosed("prefix_reuse_missed", REUSE, SLOTS)
    )
    assert ("prefix_reuse_missed", "prefix caching", "engine.enable_prefix_caching is not in the search space") in [
        (p.cause, p.lever, p.why) for p in step.passed_over
    ]
    assert tried(step) == [("batch_slots", "batch slots for the demand seen")]  # the next cause's, within the space
    assert chosen[0].knobs == {"engine.max_num_seqs": 8}  # the largest listed value: the demand seen is 16


def test_a_configuration_the_engine_refuses_is_passed_over_and_the_next_move_tried() -> None:
    refusing = planner(BOTH, per_step=1, configs=Configs({"engine.enable_prefix_caching": True}))
    step, chosen = refusing.next_step(1, Candidate("baseline", {}), diagnosed("prefix_reuse_missed", REUSE, SLOTS))
    assert [(p.lever, p.why) for p in step.passed_over] == [
        ("prefix caching", "the engine refuses engine.enable_prefix_caching=True"),
        ("radix cache", "a sglang lever (the engine is vllm)"),
    ]
    assert tried(step) == [("batch_slots", "batch slots for the demand seen")]


def test_a_point_not_diagnosed_proposes_nothing_and_says_why() -> None:
    step, chosen = planner().next_step(2, Candidate("x", {}), None)
    assert chosen == [] and step.headline == "measured no point"
    undiagnosed = Point(0, "c8", {}, {}, diagnosis=LoggedDiagnosis(headline="not diagnosed: the server failed"))
    step, chosen = planner().next_step(2, Candidate("x", {}), undiagnosed)
    assert chosen == [] and step.headline == "not diagnosed: the server failed"


def test_a_configuration_raced_before_is_passed_over_unless_a_second_look_is_due() -> None:
    plan = planner(BOTH, per_step=1)
    inc = Candidate("baseline", {})
    cached = '{"engine.enable_prefix_caching": true}'
    plan.tried[cached] = RacedBefore(1, "the incumbent stays: ..., a tie within the margin", "{}")
    step, chosen = plan.next_step(2, inc, diagnosed("prefix_reuse_missed", REUSE, SLOTS))
    assert step.passed_over[0].why == "tried already (step 1: the incumbent stays: ..., a tie within the margin)"
    assert tried(step) == [("batch_slots", "batch slots for the demand seen")]  # the next cause's move instead
    # an undecided race it led, beside the same incumbent: continued alone in a step of its own
    plan.tried[cached] = RacedBefore(1, "undecided", "{}", undecided=True, led=True, runs=2, need=5)
    step, chosen = plan.next_step(3, inc, diagnosed("prefix_reuse_missed", REUSE, SLOTS))
    assert [c.knobs for c in chosen] == [{"engine.enable_prefix_caching": True}] and chosen[0].earlier is not None
    assert step.tried[0].second_look_of == 1 and "continued to 5" in step.tried[0].change
    # ... unless the runs it needs would pass the budget
    tight = planner(BOTH, per_step=1, budget=Budget(left=4), tried=dict(plan.tried))
    step, chosen = tight.next_step(3, inc, diagnosed("prefix_reuse_missed", REUSE, SLOTS))
    assert "deciding needs 5 runs each: max_trials" in step.passed_over[0].why and chosen[0].earlier is None


def test_a_second_look_is_passed_over_where_no_number_of_runs_decides_it() -> None:
    led = RacedBefore(2, "the incumbent stays: ..., undecided", "{}", undecided=True, led=True, runs=3, need=None)
    plan = planner(BOTH, per_step=1, tried={'{"engine.enable_prefix_caching": true}': led})
    step, _ = plan.next_step(3, Candidate("baseline", {}), diagnosed("prefix_reuse_missed", REUSE))
    assert "no practical number of runs decides it" in step.passed_over[0].why
    assert step.passed_undecided is False  # a second look's verdict, not an undecided "no"
    again = dataclasses.replace(led, looks=2, need=6)  # its second look was undecided too
    plan = planner(BOTH, per_step=1, tried={'{"engine.enable_prefix_caching": true}': again})
    step, _ = plan.next_step(4, Candidate("baseline", {}), diagnosed("prefix_reuse_missed", REUSE))
    assert step.passed_over[0].why.startswith("tried already") and step.passed_undecided
