"""Token-accurate prompts: text that the model's own tokenizer encodes to exactly N tokens.

Prompts are random token ids decoded to text, then re-encoded and trimmed/padded until the
count matches (byte-level BPE merges can change counts across a decode/encode round trip).
Only tokens that round-trip to themselves are drawn, so this converges in a step or two.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

# tokenizer_config.json classes that are transformers' generic tokenizer over tokenizer.json:
# AutoTokenizer instantiates exactly this class for them (transformers 5: both names are
# TokenizersBackend).
GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(name_or_path: str) -> Any:
    """The tokenizer ``AutoTokenizer.from_pretrained`` gives, without importing what it imports
    to choose one (torch among them: ~4 of a trial's first 5 s here) when the folder names
    transformers' generic tokenizer class and has no code of its own; else AutoTokenizer."""
    folder = Path(name_or_path)
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        config = {}
    name = config.get("tokenizer_class") if isinstance(config, dict) else None
    if name in GENERIC_TOKENIZERS and "auto_map" not in config and (folder / "tokenizer.json").is_file():
        import transformers

        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls.from_pretrained(name_or_path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name_or_path)


@functools.lru_cache(maxsize=8)
def prompt_factory(tokenizer: str) -> PromptFactory:
    """The :class:`PromptFactory` of a tokenizer folder or hub id, made once per process: a
    worker prepared before its trial (``scheduling.ray_exec.prepare_workers``) has it ready, and
    trials that run one after the other in a worker share it (it keeps no state between uses)."""
    return PromptFactory(tokenizer)


class PromptFactory:
    """Makes prompts of exact token lengths with a given tokenizer (path or loaded object)."""

    def __init__(self, tokenizer: Any) -> None:
        if isinstance(tokenizer, str):
            tokenizer = load_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        ids = []
        for i in range(len(tokenizer)):
            if i in special:
                continue
            text = tokenizer.decode([i])
            if not text or "\ufffd" in text or not text.isprintable():
                continue
            if self.encode(text) == [i]:
                ids.append(i)
        if len(ids) < 16:
            raise ValueError(f"tokenizer has only {len(ids)} clean tokens to build prompts from")
        self._ids = np.asarray(ids)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def prompt(self, n_tokens: int, rng: np.random.Generator) -> str:
        """Text of exactly ``n_tokens`` tokens (best effort: off by at most a token or two)."""
        return self._fit(list(self._ids[rng.integers(0, len(self._ids), n_tokens)]), n_tokens, rng)

    def ramp_prompt(self, n_tokens: int, rng: np.random.Generator) -> str:
        """A prompt built as vLLM's benchmark client builds its random dataset (``vllm bench
        serve --dataset-name random``, vLLM 0.32): consecutive ids of the non-special vocabulary
        from a random start, then vLLM's decode/re-encode loop (10 tries, random ids appended
        when short, truncated when long), whose result may be a token or two off ``n_tokens``.

        Two prompts with the same start share their leading KV blocks: on a small vocabulary
        that happens often, and a prompt longer than one block then hits the prefix cache."""
        vocab = int(self.tokenizer.vocab_size)
        special = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        allowed = np.asarray([i for i in range(vocab) if i not in special])
        start = int(rng.integers(0, vocab))
        seq = allowed[(start + np.arange(n_tokens)) % len(allowed)].tolist()
        prompt = ""
        for tries_left in range(10, -1, -1):
            prompt = self.tokenizer.decode(seq)
            seq = self.encode(prompt)
            if tries_left == 0 or len(seq) == n_tokens:
                break
            if len(seq) < n_tokens:
                seq += rng.integers(0, vocab, n_tokens - len(seq)).tolist()
            else:
                seq = seq[:n_tokens]
        return prompt

    def _fit(self, ids: list[int], n_tokens: int, rng: np.random.Generator) -> str:
        text = str(self.tokenizer.decode(ids))
        for _ in range(8):
            enc = self.encode(text)
            if len(enc) == n_tokens:
                return text
            if len(enc) > n_tokens:
                enc = enc[:n_tokens]
            else:
                enc = enc + list(self._ids[rng.integers(0, len(self._ids), n_tokens - len(enc))])
            text = str(self.tokenizer.decode(enc))
        return text
