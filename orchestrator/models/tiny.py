"""The ``tiny_random`` model: a small random-weight Llama with a locally trained byte-level BPE.

Built deterministically (seeded weights, fixed training text) into a cache folder on first
use and reused afterwards. No network access: everything is made here. The weights are
random, so text is gibberish, but prefill/decode timing behaves like a real model's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from orchestrator.config.schema import TinyModelSpec

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
    root = os.environ.get("INFERENCE_LAB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "inference-lab")
    return Path(root) / "models"


def model_key(spec: TinyModelSpec) -> str:
    payload = json.dumps({"v": BUILD_VERSION, **spec.model_dump()}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def ensure_tiny_model(spec: TinyModelSpec, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the directory of the tiny model for ``spec``, building it if it is not cached."""
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    target = root / f"tiny_random-{model_key(spec)}"
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        build_tiny_model(spec, staging)
        try:
            staging.rename(target)  # atomic: concurrent builders race safely
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def build_tokenizer(vocab_size: int, out_dir: Path) -> None:
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
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", model_max_length=1 << 20
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))


def build_tiny_model(spec: TinyModelSpec, out_dir: Path) -> None:
    """Write config, safetensors weights and tokenizer of a seeded random Llama into ``out_dir``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    build_tokenizer(spec.vocab_size, out_dir)
    config = LlamaConfig(
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
        torch_dtype="bfloat16",
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    finally:
        torch.random.set_rng_state(generator_state)
    model.save_pretrained(str(out_dir), safe_serialization=True)
