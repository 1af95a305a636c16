"""Pre-flight, before any load: is the server the one the plan was made for?

Two checks against the running server (ours or ``engine=external``), each a clear
:class:`ConfigError` before an hour of load is spent on the wrong workload (issue 20):

* the served model names (``GET /v1/models``) hold ``model.name``;
* where the server has a tokenize endpoint (vLLM's ``POST /tokenize``), its tokenizer counts the
  planned number of tokens in a few of our prompts: another tokenizer (``model.tokenizer``,
  ``model.source``/``model.path``) makes prompts of a different length than planned.

A server without ``/tokenize`` (SGLang, a router, a P/D proxy) is judged per point instead, by
the server's own prompt-token counts (:mod:`orchestrator.metrics.fidelity`).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestrator.config.errors import ConfigError, TrialError
from orchestrator.config.schema import FidelitySpec, WorkloadSpec
from orchestrator.loadgen.prompts import PromptFactory

SAMPLE_PROMPTS = 3


@dataclass(frozen=True)
class Preflight:
    served: list[str]
    planned: list[int]  # tokens of each sample prompt by our tokenizer
    counted: list[int] | None  # by the server's tokenizer; None when it could not count them
    unchecked: str = "no tokenize endpoint"  # why not, when ``counted`` is None

    def describe(self) -> str:
        names = ", ".join(repr(s) for s in self.served) if self.served else "(no /v1/models listing)"
        tok = (
            f"{self.unchecked}: prompt lengths are checked per point from the server's usage"
            if self.counted is None
            else f"its tokenizer counts {'/'.join(map(str, self.counted))} tokens in prompts of "
            f"{'/'.join(map(str, self.planned))}"
        )
        return f"serves {names}; {tok}"


def _call(url: str, api_key: str | None, body: dict[str, Any] | None = None, timeout_s: float = 30.0) -> Any:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if body is not None else "GET")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read().decode())


def served_models(base_url: str, api_key: str | None) -> list[str]:
    try:
        data = _call(f"{base_url}/v1/models", api_key)
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 405, 501):  # a gateway without the listing: nothing to check against
            return []
        raise TrialError(f"pre-flight: GET {base_url}/v1/models answered HTTP {exc.code}") from exc
    except (OSError, ValueError) as exc:
        raise TrialError(f"pre-flight: GET {base_url}/v1/models failed: {exc}") from exc
    return [str(model.get("id")) for model in data.get("data", []) if isinstance(model, dict)]


def sample_lengths(workload: WorkloadSpec) -> list[int]:
    """Prompt lengths to try: the foreground classes' planned input tokens (128 for datasets)."""
    lengths = [c.input_tokens or 128 for c in workload.classes.values() if c.rate is None]
    return [lengths[i % len(lengths)] for i in range(SAMPLE_PROMPTS)]


def server_counts(base_url: str, model: str, api_key: str | None, prompts: list[str]) -> tuple[list[int] | None, str]:
    """Tokens the server's tokenizer finds in each prompt (no special tokens added); None and why
    when it cannot tell: no tokenize endpoint, or an answer that holds no count (a ``count``
    number or a ``tokens`` list): such an answer is not a count of 0."""
    counts = []
    url = f"{base_url}/tokenize"
    for text in prompts:
        try:
            data = _call(url, api_key, {"model": model, "prompt": text, "add_special_tokens": False})
        except urllib.error.HTTPError as exc:
            if exc.code in (404, 405, 501):
                return None, "no tokenize endpoint"
            raise TrialError(f"pre-flight: POST {url} answered HTTP {exc.code}") from exc
        except (OSError, ValueError) as exc:
            raise TrialError(f"pre-flight: POST {url} failed: {exc}") from exc
        count = _count_in(data)
        if count is None:
            shown = json.dumps(data)[:120] if not isinstance(data, (bytes, str)) else repr(data)[:120]
            return None, f"POST {url} answered without a token count ({shown})"
        counts.append(count)
    return counts, ""


def _count_in(data: Any) -> int | None:
    """The token count of a tokenize answer: ``count`` (vLLM), else the length of ``tokens``."""
    if not isinstance(data, dict):
        return None
    count = data.get("count")
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        return count
    tokens = data.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


def preflight(
    base_url: str,
    model: str,
    api_key: str | None,
    factory: PromptFactory,
    workload: WorkloadSpec,
    tokenizer: str,
    seed: int = 0,
) -> Preflight:
    """Both checks; raises :class:`ConfigError` naming the key to fix."""
    served = served_models(base_url, api_key)
    if served and model not in served:
        raise ConfigError(
            f"model.name: '{model}' is not served at {base_url}; it serves "
            f"{', '.join(repr(s) for s in served)} (set model.name to one of them)"
        )
    rng = np.random.default_rng([seed, 20])
    planned = sample_lengths(workload)
    prompts = [factory.prompt(n, rng) for n in planned]
    planned = [factory.count(p) for p in prompts]  # exact by our tokenizer
    counted, unchecked = server_counts(base_url, model, api_key, prompts)
    if counted is not None:
        check_counts(planned, counted, workload.fidelity, tokenizer)
        return Preflight(served, planned, counted)
    return Preflight(served, planned, None, unchecked)


def check_counts(planned: list[int], counted: list[int], limits: FidelitySpec, tokenizer: str) -> None:
    """The server's counts against ours: off by more than the fidelity limit (relative, or two
    tokens: no template or BOS here, one tokenizer counts its own prompts exactly) is an error."""
    for ours, theirs in zip(planned, counted):
        if abs(theirs - ours) > max(2, limits.max_prompt_tokens_error * ours):
            raise ConfigError(
                f"model.tokenizer: the server's tokenizer counts {theirs} tokens in a prompt of {ours} tokens by "
                f"ours ({tokenizer}): the prompts would not be the planned workload. Set model.tokenizer to the "
                "server's tokenizer (a folder or hub id), or model.source=path model.path=<the served model's folder>"
            )
