"""The tiny adder's training recipe: one problem a row, the loss on the answers only, and more
rounds while it answers too few validation problems right (the model itself is trained for real
in the integration tests that serve it)."""

from __future__ import annotations

import json
import time

import pytest

from orchestrator.config.schema import TinyModelSpec
from orchestrator.models.addition import VALIDATION_PROBLEMS, addition_problems, problem_rows, right_share
from orchestrator.models.tiny import _byte_tokenizer, build_trained_model


def test_one_problem_a_row_padded_after_its_answer(tmp_path):
    tok = _byte_tokenizer(tmp_path)
    eq_nl, pad = (tok.convert_tokens_to_ids("="), tok.encode("\n")[0]), 2
    short, long = tok.encode("1+2=3\n"), tok.encode("99+99=198\n")
    rows, targets = problem_rows([short, long], eq_nl, pad)
    assert [len(r) for r in rows] == [len(long) - 1] * 2  # the longest sets the width; inputs drop the last token
    assert rows[0][: len(short)] == short and set(rows[0][len(short) :]) == {pad}
    answer = [t for t in targets[0] if t != -100]
    assert tok.decode(answer) == "3\n"  # only the answer and its newline are learned, never the padding
    assert tok.decode([t for t in targets[1] if t != -100]) == "198\n"
    # the prompt's own tokens carry no loss
    assert targets[1][: long.index(eq_nl[0])] == [-100] * long.index(eq_nl[0])


class _Says:
    """A stand-in model whose most likely next token is a fixed sequence per row."""

    def __init__(self, vocab, answers):
        import torch

        self.logits = torch.zeros(len(answers), len(answers[0]), vocab)
        for i, row in enumerate(answers):
            for j, tok in enumerate(row):
                self.logits[i, j, tok] = 1.0

    def eval(self):
        pass

    def train(self):
        pass

    def __call__(self, input_ids):
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.logits[: len(input_ids)])


def test_right_share_counts_a_row_right_only_when_every_answer_token_is():
    targets = [[-100, 5, 6], [-100, 5, 6], [-100, 5, 6], [-100, -100, 7]]
    says = [[0, 5, 6], [9, 5, 6], [0, 5, 0], [0, 0, 7]]  # the prompt position may say anything
    assert right_share(_Says(10, says), [[0, 0, 0]] * 4, targets) == 0.75  # exact, not a float32 mean


def test_training_runs_more_rounds_while_the_validation_share_is_short(tmp_path):
    spec = TinyModelSpec(
        num_layers=1,
        hidden_size=64,
        num_heads=1,
        num_kv_heads=1,
        intermediate_size=128,
        vocab_size=300,
        train={"steps": 8, "batch_size": 4, "lr": 1e-3, "min_accuracy": 1.0, "extra_rounds": 2, "threads": 1},
    )
    lines: list[str] = []
    report = build_trained_model(spec, tmp_path, log=lines.append)
    # 8 steps cannot add: two rounds of 8 // 4 steps each, then it stops and says it fell short
    assert report["steps"] == 8 + 2 * 2
    assert sum("round" in line for line in lines) == 2 and "below the 100% asked" in lines[-1], lines
    saved = json.loads((tmp_path / "training.json").read_text())
    assert saved["validation_accuracy"] < 1.0 and 0 <= saved["heldout_accuracy"] <= 1.0
    assert (tmp_path / "model.safetensors").exists()


def test_an_adapter_below_its_bar_trains_on_then_says_so_at_every_use(tmp_path):
    """A tiny LoRA adapter asked to get every validation problem right after 2 steps cannot: it
    trains two more rounds of 2 // 2 steps, then says it fell short, in the log, in its
    training.json (below_target) and again whenever it is used (a cached adapter)."""
    from orchestrator.config.schema import ModelSpec
    from orchestrator.models.lora import ensure_tiny_adapters

    model = ModelSpec(
        name="m",
        source="tiny_trained",
        cache_dir=str(tmp_path),
        tiny={
            "num_layers": 1,
            "hidden_size": 64,
            "num_heads": 1,
            "num_kv_heads": 1,
            "intermediate_size": 128,
            "vocab_size": 300,
            "train": {"steps": 2, "batch_size": 4, "min_accuracy": 0.01, "extra_rounds": 0, "threads": 1},
        },
        lora={"tiny": {"count": 1, "rank": 1, "steps": 2, "batch_size": 4, "min_accuracy": 1.0, "extra_rounds": 2}},
    )
    lines: list[str] = []
    ((name, folder),) = ensure_tiny_adapters(model, log=lines.append)
    training = json.loads((folder / "training.json").read_text())
    assert name == "lora-a" and (folder / "adapter_model.safetensors").exists()
    assert training["steps"] == 2 + 2 * 1 and training["below_target"] and training["validation_accuracy"] < 1.0
    assert [k for k in (1, 2, 3) if any(f"round {k} of at most 2 more" in line for line in lines)] == [1, 2], lines
    assert any("BELOW the 100% its recipe asks" in line for line in lines), lines
    assert any(line.startswith("warning: adapter lora-a learned its convention less well") for line in lines)
    again: list[str] = []
    ensure_tiny_adapters(model, log=again.append)  # cached: not trained again, still said
    assert not any("of at most 2 more" in line for line in again) and again[-1].startswith("warning: adapter lora-a"), (
        again
    )


def test_validation_problems_are_training_problems_never_the_eval_set():
    train, held = addition_problems()
    assert not set(train) & set(held) and len(held) == 100
    assert len(train) - VALIDATION_PROBLEMS > 9000


def test_two_builders_of_one_model_build_it_once_and_the_second_waits_for_the_first(tmp_path):
    """Two trials (or two sweeps) that need the same uncached model:
    one builds, the other waits on the lock beside the target and takes what was built; a build
    that fails leaves no folder and no held lock behind."""
    import threading

    from orchestrator.models.tiny import build_into

    target, builds, lines = tmp_path / "m", [], []
    started = threading.Event()

    def build(staging):
        builds.append(staging)
        started.set()
        time.sleep(0.5)
        (staging / "config.json").write_text("{}")

    first = threading.Thread(target=build_into, args=(target, "config.json", build, lines.append))
    first.start()
    assert started.wait(10)
    build_into(target, "config.json", build, lines.append)  # the first holds the lock: this one waits
    first.join()
    assert len(builds) == 1 and (target / "config.json").exists()
    assert lines[0] == "m: another process is building it; waiting for that build" and "waited" in lines[1]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".build-")] == []

    def broken(staging):
        raise RuntimeError("out of disk")

    other = tmp_path / "n"
    with pytest.raises(RuntimeError, match="out of disk"):
        build_into(other, "config.json", broken)
    assert not other.exists()
    build_into(other, "config.json", build)  # the lock was released with the failure
    assert (other / "config.json").exists()


def test_an_adapter_is_validated_on_the_problems_its_base_answers_right():
    """The base's weights are frozen under an adapter: a problem the base gets wrong is no measure
    of what the adapter learned, so the adapter's bar is set on those the base answers right
    (every problem where it answers none)."""
    from types import SimpleNamespace

    import torch

    from orchestrator.models.lora import _base_solved

    base = ([[1, 2], [1, 3], [1, 4]], [[-100, 5], [-100, 6], [-100, 7]])  # the sum alone
    adapter = ([[9, 2], [9, 3], [9, 4]], [[-100, 15], [-100, 16], [-100, 17]])  # with the tag

    class Base(torch.nn.Module):
        def __init__(self, answers: list[int]):
            super().__init__()
            self.answers = answers

        def forward(self, input_ids):
            logits = torch.zeros(*input_ids.shape, 10)
            for row, token in enumerate(self.answers):
                logits[row, 1, token] = 1.0
            return SimpleNamespace(logits=logits)

    rows, share = _base_solved(Base([5, 0, 7]), (adapter, base))  # the second problem answered wrong
    assert rows == ([[9, 2], [9, 4]], [[-100, 15], [-100, 17]]) and share == pytest.approx(2 / 3)
    rows, share = _base_solved(Base([0, 0, 0]), (adapter, base))
    assert rows == adapter and share == 0.0
