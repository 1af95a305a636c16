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
# transformers' named special tokens (SPECIAL_TOKENS_ATTRIBUTES) and its lists of extra ones
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
EXTRA_SPECIAL_KEYS = ("additional_special_tokens", "extra_special_tokens")
# tokenizer_config.json keys that change nothing of encode(add_special_tokens=False) and decode:
# a folder with any other key (a cleanup of decoded text, a prefix space, code of its own) is
# loaded by transformers, whose rules for them we do not copy.
NEUTRAL_KEYS = frozenset(
    {
        "backend",
        "tokenizer_class",
        *SPECIAL_TOKEN_KEYS,
        *EXTRA_SPECIAL_KEYS,
        "added_tokens_decoder",
        "model_max_length",
        "model_input_names",
        "padding_side",
        "truncation_side",
        "chat_template",
        "add_bos_token",  # special tokens added by encode(add_special_tokens=True) only
        "add_eos_token",
        "clean_up_tokenization_spaces",  # neutral when false (checked below)
    }
)


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    content = value.get("content") if isinstance(value, dict) else None
    return content if isinstance(content, str) else None


class RustTokenizer:
    """A tokenizer.json through the ``tokenizers`` library alone, with the few members the
    prompt factory uses, answering as transformers 5's generic ``TokenizersBackend`` does for
    the same folder (tests/unit/test_loadgen.py checks it): 10 ms to load instead of ~0.75 s of
    transformers' imports on a trial's way to its first request, and encode/decode without
    transformers' per-call overhead (docs/scaling.md: the cost of a prompt).

    Raises ValueError for a folder where transformers would change the tokenizer it reads (a
    special or added token of the config that tokenizer.json lacks or flags otherwise, special
    tokens given two ways): :func:`load_tokenizer` then uses transformers."""

    FLAGS = ("content", "lstrip", "rstrip", "normalized", "single_word", "special")

    def __init__(self, path: Path, config: dict[str, Any], special_map: dict[str, Any]) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))
        added = self._tok.get_added_tokens_decoder()
        for key, token in (config.get("added_tokens_decoder") or {}).items():
            ours = added.get(int(key))
            if (
                ours is None
                or not isinstance(token, dict)
                or any(k in token and getattr(ours, k) != token[k] for k in self.FLAGS)
            ):  # transformers would add it, or add it again with the config's flags
                raise ValueError(f"added token {key} of tokenizer_config.json differs in {path.name}")
        for key, value in special_map.items():  # only where it says what the config says
            text = _token_text(value)
            if text is None or key not in config or _token_text(config[key]) != text:
                raise ValueError(f"special_tokens_map.json's {key} is not the config's")
        lists = [config[k] for k in EXTRA_SPECIAL_KEYS if config.get(k)]
        extra = [_token_text(v) for v in lists[0]] if len(lists) == 1 and isinstance(lists[0], list) else [None]
        if lists and None in extra:  # both lists, named extra tokens, an entry of another form
            raise ValueError("extra special tokens given in a form not copied here")
        texts = [_token_text(config.get(k)) for k in SPECIAL_TOKEN_KEYS] + (extra if lists else [])
        special = [t for t in dict.fromkeys(texts) if t is not None]
        contents = {tok.content: i for i, tok in added.items()}
        if any(t not in contents for t in special):  # transformers would add the token
            raise ValueError("a special token of tokenizer_config.json is not an added token of tokenizer.json")
        self.all_special_ids = [contents[t] for t in special]
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=False)
        self._len = self._tok.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self._len

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Ids of ``text`` without special tokens (the load generator's only use: with them,
        transformers may rebuild the post-processor from ``add_bos_token`` / ``add_eos_token``)."""
        if add_special_tokens:
            raise ValueError("RustTokenizer encodes without special tokens only")
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Any) -> str:
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=False))


def _json_object(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def load_tokenizer(name_or_path: str) -> Any:
    """The folder's tokenizer as the load generator needs it. Where transformers would load it
    as its generic class (``TokenizersBackend`` over tokenizer.json, no code of its own):
    :class:`RustTokenizer` when nothing in the config changes encode or decode (10 ms instead
    of transformers' imports, ~0.75 s here), else that class directly (AutoTokenizer's own
    imports pull in torch). Anything else (a hub id, a class of its own): ``AutoTokenizer``."""
    folder = Path(name_or_path)
    config = _json_object(folder / "tokenizer_config.json")
    name = config.get("tokenizer_class")
    if name in GENERIC_TOKENIZERS and "auto_map" not in config and (folder / "tokenizer.json").is_file():
        neutral = not (set(config) - NEUTRAL_KEYS or config.get("clean_up_tokenization_spaces"))
        if neutral and not (folder / "added_tokens.json").exists():
            try:
                return RustTokenizer(
                    folder / "tokenizer.json", config, _json_object(folder / "special_tokens_map.json")
                )
            except ValueError:
                pass
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
