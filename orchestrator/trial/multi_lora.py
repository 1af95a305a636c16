"""A trial's LoRA adapters while it runs: the workload's adapter mix naming ``model.lora``'s
adapters, an adapter loaded into a running server (``engine.lora_loading=runtime``, timed), and
whether each adapter's requests reached it (``eval.adapters``)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

from orchestrator.config.errors import TrialError
from orchestrator.config.logs import Progress
from orchestrator.config.metric_keys import M
from orchestrator.config.schema import TrialSpec, WorkloadSpec
from orchestrator.evaluation import run_eval
from orchestrator.evaluation.adapters import problems, score_adapters
from orchestrator.metrics.summary import adapter_key
from orchestrator.models import resolve_adapters
from orchestrator.models.lora import tiny_adapter_dir


def with_adapter_names(spec: TrialSpec) -> WorkloadSpec:
    """The trial's workload, its LoRA adapter mix naming model.lora's adapters when it names none."""
    mix = spec.workload.adapters
    if mix is None or mix.names is not None:
        return spec.workload
    names = [name for name, _ in resolve_adapters(spec.model, build=False)]
    return spec.workload.model_copy(update={"adapters": mix.model_copy(update={"names": names})})


def load_adapter(url: str, name: str, folder: str, api_key: str | None) -> float:
    """POST ``{"lora_name", "lora_path"}`` to a server's adapter-loading ``url``; the seconds it
    took. A refusal is a TrialError quoting the server's answer."""
    body = json.dumps({"lora_name": name, "lora_path": folder}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=300):
            pass
    except urllib.error.HTTPError as e:
        answer = e.read().decode(errors="replace")[:300]
        raise TrialError(f"loading LoRA adapter {name} from {folder}: HTTP {e.code}: {answer}") from e
    except OSError as e:
        raise TrialError(f"loading LoRA adapter {name} from {folder}: {e}") from e
    return time.monotonic() - t0


def adapter_scores(
    spec: TrialSpec, url: str, api_key: str | None, tokenizer: str, workdir: Path, say: Progress
) -> dict[str, float]:
    """Did each LoRA adapter's requests reach it (``eval.adapters``)? The tiny adapters by their
    own scorer (each answers in its own convention); one's own adapters by lm-eval's
    ``eval.tasks`` under each adapter's name (``adapter.<name>.<score>``), in ``workdir/eval-<name>``."""
    lora = spec.model.lora
    assert lora is not None  # schema: eval.adapters needs model.lora
    scores: dict[str, float] = {}
    if lora.tiny is not None:
        tiny = [(name, k) for k, name in enumerate(lora.tiny.names())]
        scores.update(score_adapters(url, spec.model.name, tiny, api_key, spec.eval.limit, progress=say))
        scores.update(kept_accuracy(spec, scores, say))
    for adapter in lora.adapters if spec.eval.tasks else []:
        got = run_eval(spec.eval, url, adapter.name, tokenizer, workdir / f"eval-{adapter.name}", api_key, say)
        scores.update({adapter_key(adapter.name, k): v for k, v in got.items()})
    return scores


def kept_accuracy(spec: TrialSpec, scores: dict[str, float], say: Progress) -> dict[str, float]:
    """Each tiny adapter's accuracy alone on the problems just scored (HF, greedy, from its
    ``training.json``: the held-out problems it got wrong) and the worst share of it the server
    kept (``adapters_kept_min``: served / alone). How well an adapter learned varies with the
    machine that trained it (docs/lora.md: 70-92%); whether serving keeps what it learned does not,
    and is what the lab's verdict asks."""
    model, lora = spec.model, spec.model.lora
    assert lora is not None and lora.tiny is not None
    if model.tiny is None:
        return {}
    scored = problems(spec.eval.limit)
    out: dict[str, float] = {}
    kept = []
    for k, name in enumerate(lora.tiny.names()):
        notes_path = tiny_adapter_dir(model.tiny, lora.tiny, k, model.cache_dir) / "training.json"
        served = scores.get(adapter_key(name, M.ACCURACY))
        try:
            wrong = {tuple(p) for p in json.loads(notes_path.read_text())["heldout_wrong"]}
        except (OSError, ValueError, KeyError):
            say(f"adapter {name}: no record of its accuracy alone ({notes_path}): what serving kept is not known")
            return {}
        alone = 1 - sum(1 for p in scored if p in wrong) / len(scored)
        out[adapter_key(name, M.TRAINED_ACCURACY)] = alone
        if served is not None and alone > 0:
            kept.append(served / alone)
    if kept:
        out[M.ADAPTERS_KEPT_MIN] = min(kept)
        say(f"adapters: served against alone (HF): the worst kept {min(kept):.0%} of its own accuracy")
    return out
