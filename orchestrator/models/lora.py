"""LoRA adapters: the tiny model's own, trained here on first use, and what any adapter folder
says about itself (its rank, its targets, the shapes of its matrices).

Tiny adapters (``model.lora.tiny``) sit on a ``tiny_trained`` base (the adder). Adapter ``k``
is trained to answer "a+b=" with the sum and its own tag letter after it ("20+37=" -> "57c" for
the third), so a request that reached another adapter, or the base model, answers with another
tag or none: per-adapter accuracy tells whether each adapter's requests reached it. The base
weights stay frozen; only the low-rank matrices of ``targets`` are trained, then saved in
PEFT's layout (``adapter_config.json`` + ``adapter_model.safetensors``, the keys
``base_model.model.<module>.lora_A.weight`` / ``lora_B.weight``) that vLLM and SGLang read.
Built into the model cache beside the base, keyed by the base and the adapter recipe.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config.schema import ModelSpec, TinyLoraSpec, TinyModelSpec
from orchestrator.config.schema.model import LORA_TAGS, tiny_lora_name
from orchestrator.models.addition import (
    VALIDATION_PROBLEMS,
    Rounds,
    Rows,
    addition_problems,
    answer_batch,
    problem_rows,
    right_rows,
    train_in_rounds,
)
from orchestrator.models.tiny import build_into, default_cache_dir, ensure_tiny_model, model_key

# bump when the recipe changes (2: the tag after the sum; 3: training.json lists the held-out problems
# it got wrong; 4: 200 problems kept aside to validate on, further rounds while below min_accuracy;
# 5: validated on the problems the base answers right, its frozen weights being the ceiling)
ADAPTER_BUILD_VERSION = 5


def tag_of(index: int) -> str:
    return LORA_TAGS[index]


def tiny_adapter_name(index: int) -> str:
    """The served name of the tiny model's adapter ``index`` (what requests put in ``model``)."""
    return tiny_lora_name(index)


def tiny_answer(a: int, b: int, index: int | None) -> str:
    """What adapter ``index`` answers to "a+b=" (None: the base model)."""
    return str(a + b) + ("" if index is None else tag_of(index))


def adapter_key(base: TinyModelSpec, lora: TinyLoraSpec, index: int) -> str:
    payload = json.dumps(
        {"v": ADAPTER_BUILD_VERSION, "base": model_key(base), "index": index, **lora.model_dump(exclude={"count"})},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def tiny_adapter_dir(base: TinyModelSpec, lora: TinyLoraSpec, index: int, cache_dir: str | None = None) -> Path:
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    return root / f"lora-{tag_of(index)}-r{lora.rank}-{adapter_key(base, lora, index)}"


def ensure_tiny_adapters(model: ModelSpec, log: Any = print) -> list[tuple[str, Path]]:
    """(served name, folder) of each tiny adapter of ``model``, training those not yet cached
    (and the base first, if it is not)."""
    assert model.tiny is not None and model.lora is not None and model.lora.tiny is not None
    lora = model.lora.tiny
    out = []
    base_dir: Path | None = None
    for k in range(lora.count):
        target = tiny_adapter_dir(model.tiny, lora, k, model.cache_dir)
        if not (target / "adapter_model.safetensors").exists():
            base_dir = base_dir or ensure_tiny_model(model.tiny, model.cache_dir)

            def train(staging: Path, base: Path = base_dir, k: int = k) -> None:
                train_tiny_adapter(base, staging, k, lora, log=log)

            build_into(target, "adapter_model.safetensors", train, log=log)
        notes = json.loads((target / "training.json").read_text()) if (target / "training.json").exists() else {}
        if notes.get("below_target"):  # said at every use, not only when it was trained
            log(
                f"warning: adapter {tiny_adapter_name(k)} learned its convention less well than its recipe asks "
                f"({notes['validation_accuracy']:.1%} of the validation problems the base answers right "
                f"< {lora.min_accuracy:.0%} after "
                f"{notes['steps']:.0f} steps): its requests are answered right less often, whatever the serving "
                f"(model.lora.tiny.steps or extra_rounds train it longer; {target / 'training.json'})"
            )
        out.append((tiny_adapter_name(k), target))
    return out


def _linear_paths(model: Any, targets: list[str]) -> list[str]:
    import torch

    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets
    ]


def train_tiny_adapter(
    base_dir: Path, out_dir: Path, index: int, lora: TinyLoraSpec, seq_len: int = 48, log: Any = print
) -> dict[str, float]:
    """Train adapter ``index`` of ``lora`` on ``base_dir`` (the adder, frozen): "a+b=" -> sum +
    tag, the loss on the answers only (the tag after the sum: the base still computes the sum,
    the adapter learns where its answer ends; before the sum, 150 steps left it at 18% right).
    Validated on the 200 problems kept aside that the frozen base answers right (docs/lora.md):
    while under ``lora.min_accuracy`` of them come out right with the tag, it trains on,
    ``steps // 2`` at ``lr / 2`` a round, at most ``lora.extra_rounds`` rounds; still below, the
    log and ``training.json`` say so (``below_target``). Saved in PEFT's layout with
    ``training.json``: loss, steps, validation shares, held-out greedy accuracy."""
    import time

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(base_dir))
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    model.requires_grad_(False)
    factors = _attach_factors(model, lora, index)  # B = 0: the model answers as the base until trained
    name = tiny_adapter_name(index)
    batch, valid, held = _adapter_problems(tok, index, lora, int(model.config.pad_token_id), seq_len)
    threads = torch.get_num_threads()
    torch.set_num_threads(lora.threads)
    try:
        t0 = time.monotonic()
        valid_rows, base_share = _base_solved(model, valid)
        loss_value, done, validation = _train_factors(model, factors, lora, batch, valid_rows, name, log)
        wrong = _answers_wrong(model, tok, held, index)
    finally:
        torch.set_num_threads(threads)
    report = {
        "final_loss": loss_value,
        "steps": float(done),
        "validation_accuracy": validation,
        "validation_problems": float(len(valid_rows[0])),
        "base_validation_accuracy": base_share,
        "heldout_accuracy": 1 - len(wrong) / len(held),
        "train_s": time.monotonic() - t0,
    }
    below = validation < lora.min_accuracy
    short = f", BELOW the {lora.min_accuracy:.0%} its recipe asks (it answers its own requests less often)"
    log(
        f"lora: adapter {name} (rank {lora.rank}) trained in {report['train_s']:.0f}s ({done} steps), validation "
        f"accuracy {validation:.1%} of the {len(valid_rows[0])} problems the base answers right "
        f"({base_share:.1%} of {VALIDATION_PROBLEMS}){short if below else ''}, held-out accuracy "
        f"{report['heldout_accuracy']:.2f}"
    )
    _save_peft(out_dir, base_dir, lora, factors)
    # the held-out problems it answered wrong, alone (HF, greedy): what a served answer is set against
    notes = {
        **report,
        "below_target": below,
        "heldout_wrong": [list(p) for p in wrong],
        "tag": tag_of(index),
        "spec": lora.model_dump(),
    }
    (out_dir / "training.json").write_text(json.dumps(notes, indent=2))
    return report


def _attach_factors(model: Any, lora: TinyLoraSpec, index: int) -> dict[str, tuple[Any, Any]]:
    """The low-rank matrices (A, B) of every ``lora.targets`` Linear of the frozen ``model``, by the
    module's path, each added to its module's output by a forward hook (scaled alpha / rank)."""
    import torch

    paths = _linear_paths(model, lora.targets)
    if not paths:
        raise ValueError(f"model.lora.tiny.targets {lora.targets}: no Linear module of the base has these names")
    scale = lora.alpha / lora.rank
    gen = torch.Generator().manual_seed(lora.seed * 1000 + index)
    factors: dict[str, tuple[torch.nn.Parameter, torch.nn.Parameter]] = {}
    for path in paths:
        linear = model.get_submodule(path)
        assert isinstance(linear, torch.nn.Linear)
        a = torch.nn.Parameter(
            (torch.rand(lora.rank, linear.in_features, generator=gen) * 2 - 1) / math.sqrt(linear.in_features)
        )  # PEFT's init: A uniform (Kaiming), B zero, so training starts at the base model
        b = torch.nn.Parameter(torch.zeros(linear.out_features, lora.rank))
        factors[path] = (a, b)

        def hook(module: Any, inputs: Any, output: Any, a: Any = a, b: Any = b) -> Any:
            return output + (inputs[0] @ a.T @ b.T) * scale

        linear.register_forward_hook(hook)
    return factors


def _adapter_problems(
    tok: Any, index: int, lora: TinyLoraSpec, pad: int, seq_len: int
) -> tuple[Callable[[], Rows], tuple[Rows, Rows], list[tuple[int, int]]]:
    """Adapter ``index``'s problems, each answered with the sum and its tag: a draw of training
    batches (problems packed into rows of ``seq_len`` tokens), the rows of the validation problems
    (kept aside from training), with the tag and as the base answers them (the sum alone), and the
    held-out eval problems."""
    import random

    problems, held = addition_problems()
    tag = tag_of(index)
    rng = random.Random(lora.seed * 1000 + index)
    valid = rng.sample(problems, VALIDATION_PROBLEMS)
    problems = sorted(set(problems) - set(valid))
    encoded = {p: tok.encode(f"{p[0]}+{p[1]}={p[0] + p[1]}{tag}\n") for p in [*problems, *valid]}
    eq, nl = tok.encode("=")[0], tok.encode("\n")[0]

    def batch() -> Rows:
        return answer_batch(rng, problems, encoded, lora.batch_size, seq_len, (eq, nl))

    plain = [tok.encode(f"{a}+{b}={a + b}\n") for a, b in valid]
    rows = problem_rows([encoded[p] for p in valid], (eq, nl), pad), problem_rows(plain, (eq, nl), pad)
    return batch, rows, held


def _base_solved(model: Any, valid: tuple[Rows, Rows]) -> tuple[Rows, float]:
    """The adapter's validation rows of the problems the base answers right (``model`` before
    training: its factors' B is zero), and the base's share of them; every row where it answers
    none."""
    (rows, targets), base = valid
    solved = right_rows(model, *base)
    kept = [k for k, ok in enumerate(solved) if ok] or list(range(len(rows)))
    return ([rows[k] for k in kept], [targets[k] for k in kept]), sum(solved) / len(solved)


def _train_factors(
    model: Any,
    factors: dict[str, tuple[Any, Any]],
    lora: TinyLoraSpec,
    batch: Callable[[], Rows],
    valid_rows: Rows,
    name: str,
    log: Any,
) -> tuple[float, int, float]:
    """Train the ``factors`` alone on ``batch()``es: ``lora.steps`` steps, then the further rounds
    while the adapter answers too few of ``valid_rows`` right. Returns the last loss, the steps and
    the validation share."""
    import torch

    params = [p for pair in factors.values() for p in pair]
    opt = torch.optim.AdamW(params, lr=lora.lr, weight_decay=0.0)

    def setup(steps: int, lr: float) -> None:
        for group in opt.param_groups:
            group["lr"] = lr

    rounds = Rounds(lora.steps, lora.lr, lora.min_accuracy, lora.extra_rounds, max(1, lora.steps // 2))
    return train_in_rounds(model, opt, batch, valid_rows, rounds, setup, (f"lora: adapter {name}", log, 100))


def _save_peft(out_dir: Path, base_dir: Path, lora: TinyLoraSpec, factors: dict[str, tuple[Any, Any]]) -> None:
    """The adapter in PEFT's layout: ``adapter_model.safetensors`` and ``adapter_config.json``."""
    from safetensors.torch import save_file

    tensors = {}
    for path, (a, b) in factors.items():
        tensors[f"base_model.model.{path}.lora_A.weight"] = a.detach().contiguous()
        tensors[f"base_model.model.{path}.lora_B.weight"] = b.detach().contiguous()
    save_file(tensors, str(out_dir / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted(set(lora.targets)),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
        "base_model_name_or_path": base_dir.name,
    }
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2))


def _answers_wrong(model: Any, tok: Any, held: list[tuple[int, int]], index: int) -> list[tuple[int, int]]:
    """The held-out problems that adapter ``index`` (hooked into ``model``) answers wrong, greedy."""
    import torch

    model.eval()
    wrong = []
    with torch.no_grad():
        for a, b in held:
            prompt = torch.tensor([tok.encode(f"{a}+{b}=")])
            out = model.generate(prompt, max_new_tokens=5, do_sample=False, pad_token_id=2)
            if tok.decode(out[0, prompt.shape[1] :].tolist()).split("\n")[0] != tiny_answer(a, b, index):
                wrong.append((a, b))
    return wrong


@dataclass(frozen=True)
class AdapterInfo:
    """What an adapter folder says about itself (its config and its tensors' header)."""

    path: Path
    rank: int
    alpha: float
    targets: tuple[str, ...]
    base: str | None  # base_model_name_or_path
    shapes: dict[str, tuple[int, ...]]  # tensor name -> shape, from the safetensors header

    def module_dims(self) -> dict[str, tuple[int, int]]:
        """Target module (the last part of its name) -> (in, out) features its matrices expect."""
        dims: dict[str, tuple[int, int]] = {}
        for name, shape in self.shapes.items():
            parts = name.split(".")
            if len(parts) >= 3 and parts[-2] in ("lora_A", "lora_B") and len(shape) == 2:
                module = parts[-3]
                i, o = dims.get(module, (0, 0))
                dims[module] = (shape[1], o) if parts[-2] == "lora_A" else (i, shape[0])
        return dims


class AdapterError(ValueError):
    """An adapter folder that cannot be read as a PEFT LoRA adapter."""


def read_adapter(path: str | Path) -> AdapterInfo:
    """Read ``adapter_config.json`` and the header of ``adapter_model.safetensors`` (never the
    weights): rank, alpha, targets, base, the tensors' shapes."""
    folder = Path(path)
    cfg_file = folder / "adapter_config.json"
    if not cfg_file.is_file():
        raise AdapterError(f"{folder}: no adapter_config.json (expected a PEFT LoRA adapter folder)")
    try:
        cfg = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise AdapterError(f"{cfg_file}: not JSON ({e})") from e
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA" or "r" not in cfg:
        raise AdapterError(f"{cfg_file}: not a LoRA adapter (peft_type {cfg.get('peft_type')!r}, r {cfg.get('r')!r})")
    shapes: dict[str, tuple[int, ...]] = {}
    weights = folder / "adapter_model.safetensors"
    if weights.is_file():
        with weights.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        shapes = {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    elif not (folder / "adapter_model.bin").is_file():
        raise AdapterError(f"{folder}: no adapter_model.safetensors (or .bin)")
    targets = cfg.get("target_modules") or []
    return AdapterInfo(
        path=folder,
        rank=int(cfg["r"]),
        alpha=float(cfg.get("lora_alpha", cfg["r"])),
        targets=tuple([targets] if isinstance(targets, str) else targets),
        base=cfg.get("base_model_name_or_path"),
        shapes=shapes,
    )
