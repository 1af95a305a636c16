"""The addition task the tiny models learn ("a+b=" -> the sum and a newline, one problem a row):
the problems and the held-out eval set, training rows whose targets are the answers' tokens only,
the share of validation rows answered right, and the further rounds of training while that share
is short of a bar. Used by the adder (:mod:`.tiny`) and its LoRA adapters (:mod:`.lora`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EVAL_SET = Path(__file__).resolve().parents[1] / "evaluation" / "tasks" / "addition.jsonl"
# Training problems kept aside to validate on: never trained on, and the eval set never looked at.
VALIDATION_PROBLEMS = 200

Rows = tuple[list[list[int]], list[list[int]]]  # rows of token ids, and their answers' targets


def addition_problems() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(training problems, held-out problems): all 10,000 pairs of 0..99, minus the eval set."""
    held = [(int(d["a"]), int(d["b"])) for d in map(json.loads, EVAL_SET.read_text().splitlines())]
    excluded = set(held)
    return [(a, b) for a in range(100) for b in range(100) if (a, b) not in excluded], held


def _answer_targets(ids: list[int], eq_nl: tuple[int, int], pad: int | None = None) -> list[int]:
    """The next token of each position of ``ids`` where it is inside an answer (after '=', up to
    the newline), -100 (ignored) elsewhere and on padding."""
    eq, nl = eq_nl
    target, inside = [], False
    for cur, nxt in zip(ids, ids[1:]):
        inside = inside or cur == eq
        target.append(nxt if inside and nxt != pad else -100)
        if cur == nl:
            inside = False
    return target


def answer_batch(
    rng: Any,
    problems: list[tuple[int, int]],
    encoded: dict[tuple[int, int], list[int]],
    batch_size: int,
    seq_len: int,
    eq_nl: tuple[int, int],
) -> Rows:
    """One training batch: rows of problems packed to ``seq_len`` tokens, and targets that are
    the next token inside an answer (after '=', up to the newline) and -100 (ignored) elsewhere."""
    rows, targets = [], []
    for _ in range(batch_size):
        ids: list[int] = []
        while len(ids) < seq_len + 1:
            ids += encoded[rng.choice(problems)]
        ids = ids[: seq_len + 1]
        rows.append(ids[:-1])
        targets.append(_answer_targets(ids, eq_nl))
    return rows, targets


def problem_rows(encoded: list[list[int]], eq_nl: tuple[int, int], pad: int) -> Rows:
    """One problem a row, padded on the right to the longest (so a causal model never sees the
    padding before an answer), with the answers' targets (:func:`_answer_targets`)."""
    width = max(len(ids) for ids in encoded)
    rows, targets = [], []
    for ids in encoded:
        padded = ids + [pad] * (width - len(ids))
        rows.append(padded[:-1])
        targets.append(_answer_targets(padded, eq_nl, pad))
    return rows, targets


def loss_steps(model: Any, opt: Any, batch: Callable[[], Rows], steps: int, sched: Any = None) -> Iterator[float]:
    """``steps`` optimizer steps of ``model`` on ``batch()``es (the cross-entropy of the answers'
    targets, padding and prompts ignored), ``sched`` stepped after each when given; yields each
    step's loss."""
    import torch

    for _ in range(steps):
        rows, targets = batch()
        logits = model(input_ids=torch.tensor(rows)).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), torch.tensor(targets).reshape(-1), ignore_index=-100
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        yield loss.item()


@dataclass(frozen=True)
class Rounds:
    """A training recipe: ``steps`` at ``lr``, then rounds of ``round_steps`` at ``lr / 2`` while
    fewer than ``bar`` of the validation problems come out right, at most ``extra_rounds``."""

    steps: int
    lr: float
    bar: float
    extra_rounds: int
    round_steps: int


def train_in_rounds(
    model: Any,
    opt: Any,
    batch: Callable[[], Rows],
    valid_rows: Rows,
    rounds: Rounds,
    setup: Callable[[int, float], Any],
    say: tuple[str, Callable[[str], None], int],
) -> tuple[float, int, float]:
    """Train ``model`` by ``rounds``: ``setup(steps, lr)`` before each run returns the scheduler
    to step (or None); ``say`` is (who, log, every): the loss logged every so many steps, and the
    validation share before each further round. Returns the last loss, the steps and the last
    validation share (still short of the bar when the rounds ran out)."""
    who, log, every = say
    t0, loss_value, done = time.monotonic(), float("nan"), 0

    def run(steps: int, lr: float) -> None:
        nonlocal loss_value, done
        sched = setup(steps, lr)
        model.train()
        for loss_value in loss_steps(model, opt, batch, steps, sched):
            done += 1
            if done % every == 0:
                log(f"{who}: step {done}, loss {loss_value:.3f}, {time.monotonic() - t0:.0f}s")

    run(rounds.steps, rounds.lr)
    now, k = right_share(model, *valid_rows), 0
    while now < rounds.bar and k < rounds.extra_rounds:
        k += 1
        log(
            f"{who}: {now:.1%} of the validation problems right after {done} steps "
            f"(< {rounds.bar:.0%}): round {k} of at most {rounds.extra_rounds} more"
        )
        run(rounds.round_steps, rounds.lr / 2)
        now = right_share(model, *valid_rows)
    return loss_value, done, now


def right_share(model: Any, rows: list[list[int]], targets: list[list[int]]) -> float:
    """The share of rows whose every answer token is the model's most likely next token: what
    greedy decoding of the answer gets right, in one batched forward pass."""
    return sum(right_rows(model, rows, targets)) / len(rows)  # exact: 190/200 is 0.95


def right_rows(model: Any, rows: list[list[int]], targets: list[list[int]]) -> list[bool]:
    """Whether each row's every answer token is the model's most likely next token (greedy
    decoding gets its answer right), in one batched forward pass."""
    import torch

    model.eval()
    with torch.no_grad():
        predicted = model(input_ids=torch.tensor(rows)).logits.argmax(-1)
    model.train()
    want = torch.tensor(targets)
    return [bool(x) for x in ((predicted == want) | (want == -100)).all(-1).tolist()]
