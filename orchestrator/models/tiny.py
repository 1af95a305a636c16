"""The ``tiny_random`` model: a small random-weight Llama with a locally trained byte-level BPE.

Built deterministically (seeded weights, fixed training text) into a cache folder on first
use and reused afterwards. No network access: everything is made here. The weights are
random, so text is gibberish, but prefill/decode timing behaves like a real model's.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from orchestrator.config.paths import cache_root
from orchestrator.config.schema import TinyModelSpec, TinyTrainSpec
from orchestrator.models.addition import (
    VALIDATION_PROBLEMS,
    Rounds,
    Rows,
    addition_problems,
    problem_rows,
    train_in_rounds,
)

BUILD_VERSION = 2  # bump when the build recipe changes, so old caches are not reused

# Training text for the tokenizer: a few varied sentences are enough for a 512-token vocab.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.",
    "Large language model serving separates prefill, which processes the prompt, from decode.",
    "Each decode step reads the key and value cache of every previous token in the sequence.",
    "Chunked prefill splits a long prompt into pieces so that decode steps are not blocked.",
    "Prefix caching reuses the KV cache of a shared system prompt across many requests.",
    "Throughput rises with batch size until memory bandwidth or compute saturates the device.",
    "In 1969 the first message was sent over ARPANET; it read 'lo' before the system crashed.",
    "Numbers like 0 1 2 3 4 5 6 7 8 9 10 42 128 256 512 1024 2048 4096 appear in configs.",
    "She asked: how many tokens per second can we serve at a p99 latency of 200 ms?",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # prints 5",
    "Über café naïve résumé — unicode text should round-trip through byte-level BPE.",
    "Speculative decoding proposes draft tokens that the target model verifies in one pass.",
]

SPECIAL_TOKENS = ["<s>", "</s>", "<pad>"]
# A minimal chat template, so the chat-completions API works with the tiny model.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def default_cache_dir() -> Path:
    return cache_root() / "models"


def model_key(spec: TinyModelSpec) -> str:
    """The unquantized model's key (a quantized model is its base model plus a suffix)."""
    exclude = {"quantization"} | ({"train"} if spec.train is None else set())  # random models keep their key
    data = spec.model_dump(exclude=exclude)
    payload = json.dumps({"v": BUILD_VERSION, **data}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def tiny_dir_name(spec: TinyModelSpec) -> str:
    suffix = f"-{QUANT_SUFFIX[spec.quantization]}" if spec.quantization else ""
    return f"{'tiny_trained' if spec.train else 'tiny_random'}-{model_key(spec)}{suffix}"


def ensure_tiny_model(spec: TinyModelSpec, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the directory of the tiny model for ``spec``, building it if it is not cached
    (a quantized model from its unquantized base, itself built or trained first)."""
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    target = root / tiny_dir_name(spec)
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    base = ensure_tiny_model(spec.model_copy(update={"quantization": None}), cache_dir) if spec.quantization else None

    def build(staging: Path) -> None:
        if base is not None:
            assert spec.quantization is not None
            quantize_model(base, staging, spec.quantization)
        elif spec.train is not None:
            build_trained_model(spec, staging)
        else:
            build_tiny_model(spec, staging)

    build_into(target, "config.json", build)
    return target


def build_into(target: Path, marker: str, build: Callable[[Path], None], log: Any = print) -> None:
    """Run ``build`` into a staging folder beside ``target``, then rename it to ``target``.

    One builder at a time per target: the others (two trials of a sweep, two sweeps) wait on a
    lock beside it and then take what it built, rather than train the same model again at the
    same time. The rename is atomic; a loser keeps the winner's when it holds ``marker``. The
    lock is the kernel's (``flock``), released when its file is closed: a builder that dies
    releases it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(target, log):
        if (target / marker).exists():  # built by the one we waited for
            return
        staging = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
        try:
            build(staging)
            try:
                staging.rename(target)
            except OSError:
                if not (target / marker).exists():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _build_lock(target: Path, log: Any) -> Iterator[None]:
    with open(target.parent / f".{target.name}.lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"{target.name}: another process is building it; waiting for that build")
            t0 = time.monotonic()
            fcntl.flock(f, fcntl.LOCK_EX)
            log(f"{target.name}: waited {time.monotonic() - t0:.0f}s for the other build")
        yield


def build_tokenizer(vocab_size: int, out_dir: Path, corpus: list[str] | None = None) -> Any:
    """A byte-level BPE trained on ``corpus`` (default: the sentences above), saved in
    ``out_dir`` with the chat template; returns it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4 if corpus is None else corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", model_max_length=1 << 20
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return fast


def llama_config(spec: TinyModelSpec, dtype: str) -> Any:
    """The ``transformers`` config of a tiny model of this shape."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
        torch_dtype=dtype,
    )


def build_tiny_model(spec: TinyModelSpec, out_dir: Path) -> None:
    """Write config, safetensors weights and tokenizer of a seeded random Llama into ``out_dir``."""
    import torch
    from transformers import LlamaForCausalLM

    build_tokenizer(spec.vocab_size, out_dir)
    config = llama_config(spec, "bfloat16")
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    finally:
        torch.random.set_rng_state(generator_state)
    model.save_pretrained(str(out_dir), safe_serialization=True)


# Our names -> compressed-tensors preset schemes (compressed_tensors.quantization.preset_name_to_scheme).
QUANT_PRESETS = {"w8a8": "W8A8", "w4a16": "W4A16"}
# The cache folder's suffix per method: changes when its recipe does (w8a8: asymmetric activations).
QUANT_SUFFIX = {"w8a8": "w8a8-asym", "w4a16": "w4a16"}


def quantize_model(base: Path, out_dir: Path, method: str) -> None:
    """Quantize the model in ``base`` into ``out_dir`` with compressed-tensors (the library vLLM
    reads these checkpoints with; a dependency of vLLM's CPU build), data-free: each Linear
    weight's scale from its own min/max (per output channel, or per group of 128), ``lm_head``
    kept. vLLM finds ``quantization_config`` in config.json and picks its CPU kernels (oneDNN
    INT8 for w8a8, with asymmetric activations; the WNA16 kernel for w4a16)."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationStatus,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from compressed_tensors.quantization.utils.helpers import calculate_qparams
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.bfloat16)
    scheme = preset_name_to_scheme(QUANT_PRESETS[method], ["Linear"])
    if method == "w8a8" and scheme.input_activations is not None:
        # Asymmetric (dynamic, per-token) activations: vLLM 0.32's CPU INT8 kernel then takes
        # oneDNN with the activations' own dtype on every CPU. With symmetric ones an AMX CPU
        # (Sapphire Rapids and newer) takes int8_scaled_mm_with_quant, which accepts bfloat16
        # or float16 activations only: a float32 trial's engine died on its first request.
        scheme.input_activations.symmetric = False
    config = QuantizationConfig(
        config_groups={"group_0": scheme},
        ignore=["lm_head"],
        quantization_status=QuantizationStatus.INITIALIZED,
    )
    apply_quantization_config(model, config)
    for module in model.modules():
        scheme = getattr(module, "quantization_scheme", None)
        if scheme is None or scheme.weights is None:
            continue
        w, args = module.weight.detach().float(), scheme.weights
        if args.strategy == "group":
            grouped = w.unflatten(-1, (-1, args.group_size))
            lo, hi = grouped.amin(-1), grouped.amax(-1)
        elif args.strategy == "channel":
            lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
        else:
            lo, hi = w.amin().reshape(1), w.amax().reshape(1)
        scale, zero_point = calculate_qparams(lo, hi, args)
        module.weight_scale.data.copy_(scale.to(module.weight_scale.dtype))
        if hasattr(module, "weight_zero_point"):
            module.weight_zero_point.data.copy_(zero_point.to(module.weight_zero_point.dtype))
        module.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    compressor.update_config(str(out_dir))
    for f in base.iterdir():  # tokenizer, chat template, training notes
        if f.is_file() and not (out_dir / f.name).exists():
            shutil.copy2(f, out_dir / f.name)


def _byte_tokenizer(out_dir: Path) -> Any:
    """A byte-level tokenizer without merges: every digit and sign is one token, so the
    arithmetic the tiny model learns is not blurred by multi-digit tokens."""
    return build_tokenizer(len(SPECIAL_TOKENS) + 256, out_dir, ["a"])  # nothing to merge: the alphabet only


def _correct_answers(model: Any, tok: Any, held: list[tuple[int, int]]) -> int:
    """Held-out problems the model answers right, greedy."""
    import torch

    model.eval()
    correct = 0
    with torch.no_grad():
        for a, b in held:
            prompt = torch.tensor([tok.encode(f"{a}+{b}=")])
            out = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=2)
            correct += tok.decode(out[0, prompt.shape[1] :].tolist()).split("\n")[0] == str(a + b)
    return correct


def build_trained_model(spec: TinyModelSpec, out_dir: Path, log: Any = print) -> dict[str, float]:
    """Train a tiny Llama on 2-digit addition ("a+b=" -> the sum and a newline, one problem a
    row, the loss on the answers only) on the CPU: ``spec.train.steps`` steps of a one-cycle
    schedule, then rounds of ``steps // 4`` at half the rate while it answers fewer than
    ``min_accuracy`` of the validation problems right (200 training problems kept aside; the
    eval set is never looked at while training), at most ``extra_rounds`` of them. Save it with
    its tokenizer. Returns the final training loss, the validation accuracy, the greedy
    accuracy on the 100 held-out eval problems, the steps and the seconds (also saved in
    ``training.json``)."""
    import torch
    from transformers import LlamaForCausalLM

    train = spec.train
    assert train is not None
    tok = _byte_tokenizer(out_dir)
    config = llama_config(spec, "float32")
    batch, valid_rows, held = _adder_problems(tok, spec.seed, train.batch_size, int(config.pad_token_id))
    threads = torch.get_num_threads()
    state = torch.random.get_rng_state()
    torch.set_num_threads(train.threads)
    try:
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config)
        t0 = time.monotonic()
        loss_value, done, validation = _train_adder(model, train, batch, valid_rows, log)
        correct = _correct_answers(model, tok, held)
    finally:
        torch.set_num_threads(threads)
        torch.random.set_rng_state(state)
    report = {
        "final_loss": loss_value,
        "validation_accuracy": validation,
        "heldout_accuracy": correct / len(held),
        "steps": float(done),
        "train_s": time.monotonic() - t0,
    }
    below = "" if validation >= train.min_accuracy else f", below the {train.min_accuracy:.0%} asked"
    log(
        f"tiny_trained: validation accuracy {validation:.1%}{below}, held-out accuracy "
        f"{report['heldout_accuracy']:.2f}, after {done} steps in {report['train_s']:.0f}s"
    )
    model.save_pretrained(str(out_dir), safe_serialization=True)
    (out_dir / "training.json").write_text(json.dumps({**report, "spec": spec.model_dump()}, indent=2))
    return report


def _adder_problems(
    tok: Any, seed: int, batch_size: int, pad: int
) -> tuple[Callable[[], Rows], Rows, list[tuple[int, int]]]:
    """The adder's problems, each encoded as "a+b=", its sum and a newline: a draw of training
    batches (one problem a row), the rows of the validation problems (kept aside from training)
    and the held-out eval problems."""
    import random

    problems, held = addition_problems()
    rng = random.Random(seed)
    valid = rng.sample(problems, VALIDATION_PROBLEMS)
    kept_aside = set(valid)
    problems = [p for p in problems if p not in kept_aside]
    encoded = {p: tok.encode(f"{p[0]}+{p[1]}={p[0] + p[1]}\n") for p in [*problems, *valid]}
    eq_nl = (tok.convert_tokens_to_ids("="), tok.encode("\n")[0])

    def batch() -> Rows:
        return problem_rows([encoded[rng.choice(problems)] for _ in range(batch_size)], eq_nl, pad)

    return batch, problem_rows([encoded[p] for p in valid], eq_nl, pad), held


def _train_adder(
    model: Any, train: TinyTrainSpec, batch: Callable[[], Rows], valid_rows: Rows, log: Any
) -> tuple[float, int, float]:
    """Train ``model`` on ``batch()``es: ``train.steps`` steps of a one-cycle schedule, then the
    further rounds while it answers too few of ``valid_rows`` right. Returns the last loss, the
    steps and the validation share."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=train.lr, betas=(0.9, 0.98), weight_decay=0.1)

    def setup(steps: int, lr: float) -> Any:
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)

    rounds = Rounds(train.steps, train.lr, train.min_accuracy, train.extra_rounds, max(1, train.steps // 4))
    return train_in_rounds(model, opt, batch, valid_rows, rounds, setup, ("tiny_trained", log, 400))
