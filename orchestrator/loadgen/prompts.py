"""Token-accurate prompts: text that the model's own tokenizer encodes to exactly N tokens.

Prompts are random token ids decoded to text, then re-encoded and trimmed/padded until the
count matches (byte-level BPE merges can change counts across a decode/encode round trip).
Only tokens that round-trip to themselves are drawn, so this converges in a step or two.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class PromptFactory:
    """Makes prompts of exact token lengths with a given tokenizer (path or loaded object)."""

    def __init__(self, tokenizer: Any) -> None:
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
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
        """A prompt built as vLLM's benchmark client builds its random dataset: consecutive
        token ids from a random start (``vllm bench serve --dataset-name random``). Two prompts
        with the same start share their leading KV blocks: on a small vocabulary that happens
        often, and the server's prefix cache answers part of their prefill."""
        start = int(rng.integers(0, len(self._ids)))
        return self._fit(list(self._ids[(start + np.arange(n_tokens)) % len(self._ids)]), n_tokens, rng)

    def _fit(self, ids: list[int], n_tokens: int, rng: np.random.Generator) -> str:
        text = self.tokenizer.decode(ids)
        for _ in range(8):
            enc = self.encode(text)
            if len(enc) == n_tokens:
                return text
            if len(enc) > n_tokens:
                enc = enc[:n_tokens]
            else:
                enc = enc + list(self._ids[rng.integers(0, len(self._ids), n_tokens - len(enc))])
            text = self.tokenizer.decode(enc)
        return text
