"""Did each adapter's requests reach it? The tiny adapters' own scorer.

Each tiny LoRA adapter answers "a+b=" with the sum and its tag letter after it
(:mod:`orchestrator.models.lora`), the base model with the sum alone. After a trial's load
points, :func:`score_adapters` sends the held-out addition problems to the trial's server under
every adapter's name (and the base model's), greedy, and reads the answers: right (this
adapter's tag and the sum), or in the convention of another adapter or of the base (the request
reached the wrong weights), or neither. Per adapter: ``adapter.<name>.accuracy`` and
``adapter.<name>.misrouted`` (the share answered in another's convention).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from orchestrator.config.errors import TrialError
from orchestrator.config.metric_keys import M
from orchestrator.config.schema.model import LORA_TAGS as TAGS
from orchestrator.metrics.summary import BASE_MODEL, adapter_key

EVAL_SET = Path(__file__).resolve().parent / "tasks" / "addition.jsonl"


def problems(limit: int | None = None) -> list[tuple[int, int]]:
    rows = [json.loads(line) for line in EVAL_SET.read_text().splitlines() if line.strip()]
    pairs = [(int(r["a"]), int(r["b"])) for r in rows]
    return pairs[:limit] if limit else pairs


def convention(answer: str, a: int, b: int) -> int | None | str:
    """Whose convention ``answer`` to "a+b=" follows: the tag's adapter index, None for the base
    (the sum alone), "" for neither (a wrong sum, or no answer)."""
    total = str(a + b)
    if answer == total:
        return None
    if len(answer) == len(total) + 1 and answer[:-1] == total and answer[-1] in TAGS:
        return TAGS.index(answer[-1])
    return ""


def _complete(base_url: str, model: str, prompt: str, api_key: str | None, timeout_s: float) -> str:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 6, "temperature": 0.0, "stop": ["\n"]}).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(base_url.rstrip("/") + "/v1/completions", data=body, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - the trial's own server
        return str(json.loads(resp.read())["choices"][0]["text"]).strip()


def score_adapters(
    base_url: str,
    base_model: str,
    adapters: list[tuple[str, int]],
    api_key: str | None = None,
    limit: int | None = None,
    concurrency: int = 4,
    timeout_s: float = 120.0,
    progress: Callable[[str], None] = print,
) -> dict[str, float]:
    """Score every adapter (served name, tag index) and the base model on the held-out problems;
    returns ``adapter.<name>.accuracy`` / ``.misrouted`` (the base as ``adapter.base.*``), the
    adapters' worst accuracy (``adapters_accuracy_min``) and the worst share misrouted, the base
    model's included (``adapters_misrouted_max``)."""
    asked = [*((name, k) for name, k in adapters), (base_model, None)]
    pairs = problems(limit)
    # problem by problem, every adapter and the base in turn: requests of several adapters and of
    # the base share the server's batches, as in traffic (one adapter after the other would not
    # catch a server that applies a batch's adapter to its base-model requests)
    jobs = [(name, k, a, b) for a, b in pairs for name, k in asked]
    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            answers = list(pool.map(lambda j: _complete(base_url, j[0], f"{j[2]}+{j[3]}=", api_key, timeout_s), jobs))
    except OSError as e:
        raise TrialError(f"scoring the LoRA adapters: {type(e).__name__}: {e}") from e
    out: dict[str, float] = {}
    words = []
    worst_right, worst_misrouted = 1.0, 0.0
    for name, k in asked:
        mine = [(convention(ans, a, b), k) for (n, _, a, b), ans in zip(jobs, answers, strict=True) if n == name]
        right = sum(1 for got, want in mine if got == want)
        misrouted = sum(1 for got, want in mine if got != "" and got != want)
        key = BASE_MODEL if k is None else name
        out[adapter_key(key, M.ACCURACY)] = right / len(mine)
        out[adapter_key(key, M.MISROUTED)] = misrouted / len(mine)
        words.append(f"{key} {right}/{len(mine)}" + (f" ({misrouted} misrouted)" if misrouted else ""))
        if k is not None:
            worst_right = min(worst_right, right / len(mine))
        worst_misrouted = max(worst_misrouted, misrouted / len(mine))  # the base's too
    if adapters:
        out[M.ADAPTERS_ACCURACY_MIN], out[M.ADAPTERS_MISROUTED_MAX] = worst_right, worst_misrouted
    progress(f"adapters scored in {time.monotonic() - t0:.0f}s: right answers {', '.join(words)}")
    return out


__all__ = ["convention", "problems", "score_adapters"]
