"""Accuracy of a trial's server, scored by lm-eval.

After a trial's load points, :func:`run_eval` runs ``lm_eval`` with its ``local-completions``
model against the trial's own endpoint (the front server: the proxy under P/D), in a
subprocess in its own process group (killed on timeout or Ctrl-C), and returns the scores as
metrics. ``accuracy`` and ``accuracy_stderr`` are the first task's primary metric, so reports
can compare trials ("fastest configuration with accuracy >= baseline - delta"); every
task's metrics are also returned as ``eval_<task>_<metric>``.

Tasks shipped here (``tasks/``) run offline: their YAML and data are copied into the
trial's folder and lm-eval runs there with the HF hub switched off. Every path lm-eval is
given is absolute (it runs in another working directory). A failure's first line is the
cause lm-eval printed (``ValueError: Tasks not found: ...``); its log's last lines follow. The API key, if the
server has one, reaches lm-eval through ``OPENAI_API_KEY`` in its environment, never argv.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.config.errors import TrialError
from orchestrator.config.logs import explain
from orchestrator.config.metric_keys import M
from orchestrator.config.schema import EvalSpec

TASKS_DIR = Path(__file__).resolve().parent / "tasks"


class EvalError(TrialError):
    """lm-eval failed or timed out: the trial's measurements stand, its accuracy is missing."""


def local_task_names() -> list[str]:
    return sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))


@functools.lru_cache(maxsize=1)
def _lm_eval_tasks() -> frozenset[str] | None:
    """Every task and group lm-eval knows here (its TaskManager reads ~15,000 task files: ~15 s,
    once per process); None where lm-eval is not installed (the trial's own error says so)."""
    try:
        from lm_eval.tasks import TaskManager
    except ImportError:
        return None
    return frozenset(TaskManager().all_tasks)


def task_problem(spec: EvalSpec) -> str | None:
    """Why ``eval.tasks`` cannot run, said before any server starts (it was found only after the
    load points, when lm-eval ran): a local task not shipped, or a name lm-eval does not know."""
    if not spec.tasks:
        return None
    if spec.local_tasks:
        missing = [t for t in spec.tasks if not (TASKS_DIR / f"{t}.yaml").exists()]
        return f"eval.tasks: no local task {missing} (shipped: {', '.join(local_task_names())})" if missing else None
    known = _lm_eval_tasks()
    unknown = [t for t in spec.tasks if known is not None and t not in known]
    if not unknown:
        return None
    close = sorted({c for t in unknown for c in difflib.get_close_matches(t, known or (), n=3)})
    return f"eval.tasks: lm-eval has no task {unknown}" + (f" (closest: {', '.join(close)})" if close else "")


def eval_argv(
    spec: EvalSpec, model_name: str, completions_url: str, tokenizer: str, out_dir: Path, include_path: Path | None
) -> list[str]:
    """The lm-eval command line (an argv list)."""
    for label, value in (("model name", model_name), ("tokenizer path", tokenizer), ("URL", completions_url)):
        if "," in value:  # model_args is a comma-separated key=value list
            raise EvalError(f"lm-eval model_args cannot carry a {label} with ',': {value!r}")
    model_args = ",".join(
        [
            f"model={model_name}",
            f"base_url={completions_url}",
            f"tokenizer={tokenizer}",
            f"num_concurrent={spec.num_concurrent}",
            "tokenized_requests=False",
            f"max_gen_toks={spec.max_gen_toks}",
            "max_retries=3",
        ]
    )
    argv = [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        "local-completions",
        "--model_args",
        model_args,
        "--tasks",
        ",".join(spec.tasks),
        "--batch_size",
        "1",
        "--output_path",
        str(out_dir),
        "--log_samples",
    ]
    if include_path is not None:
        argv += ["--include_path", str(include_path)]
    if spec.limit is not None:
        argv += ["--limit", str(spec.limit)]
    if spec.num_fewshot is not None:
        argv += ["--num_fewshot", str(spec.num_fewshot)]
    return argv


def prepare_local_tasks(spec: EvalSpec, workdir: Path) -> Path | None:
    """Copy the shipped tasks (YAML + data) into ``workdir/eval_tasks``; None if not local."""
    if not spec.local_tasks:
        return None
    problem = task_problem(spec)  # the sweep checked it before starting: here for a trial run alone
    if problem:
        raise EvalError(problem)
    dest = workdir / "eval_tasks"
    dest.mkdir(parents=True, exist_ok=True)
    for f in TASKS_DIR.iterdir():
        if f.is_file():
            shutil.copy(f, dest / f.name)
    return dest


def parse_results(out_dir: Path, tasks: list[str]) -> dict[str, float]:
    """Scores from lm-eval's results_*.json: ``eval_<task>_<metric>`` (filter ``none``
    dropped from the name), ``accuracy``/``accuracy_stderr`` for the first task's first metric."""
    files = sorted(out_dir.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise EvalError(f"lm-eval wrote no results file under {out_dir}")
    results = json.loads(files[-1].read_text())["results"]
    metrics: dict[str, float] = {}
    primary: tuple[float, float | None] | None = None
    for task in tasks:
        scores = results.get(task)
        if scores is None:
            raise EvalError(f"lm-eval results have no task {task!r} (have {sorted(results)})")
        for key, value in scores.items():
            if "," not in key or not isinstance(value, (int, float)):
                continue
            metric, filt = key.split(",", 1)
            name = f"eval_{task}_{metric}" + ("" if filt == "none" else f"_{filt}")
            metrics[name.replace("-", "_")] = float(value)
            if primary is None and not metric.endswith("_stderr"):
                stderr = scores.get(f"{metric}_stderr,{filt}")
                primary = (float(value), float(stderr) if isinstance(stderr, (int, float)) else None)
    if primary is not None:
        metrics[M.ACCURACY] = primary[0]
        if primary[1] is not None and math.isfinite(primary[1]):
            metrics[M.ACCURACY_STDERR] = primary[1]
    return metrics


def run_eval(
    spec: EvalSpec,
    base_url: str,
    model_name: str,
    tokenizer: str,
    workdir: Path,
    api_key: str | None = None,
    progress=print,
) -> dict[str, float]:
    """Score the server at ``base_url`` on ``spec.tasks``; returns metrics (see module doc)."""
    if not spec.tasks:
        return {}
    workdir = Path(os.path.abspath(workdir))  # lm-eval runs in another folder: no relative path may reach it
    if os.path.exists(tokenizer):  # a local folder (else a hub id)
        tokenizer = os.path.abspath(tokenizer)
    include = prepare_local_tasks(spec, workdir)
    out_dir = workdir / "eval"
    argv = eval_argv(spec, model_name, base_url.rstrip("/") + "/v1/completions", tokenizer, out_dir, include)
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    if spec.local_tasks:
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.pop("OPENAI_API_KEY", None)
    if api_key:
        env["OPENAI_API_KEY"] = api_key
    log_path = workdir / "eval.log"
    progress(f"evaluating accuracy: lm-eval {','.join(spec.tasks)} on {base_url}")
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            argv, cwd=include or workdir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            _guard(proc.pid)
        except BaseException:  # no watchdog (or Ctrl-C right here): lm-eval is not left behind
            _kill(proc)
            raise
        try:
            code = proc.wait(timeout=spec.timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise EvalError(f"lm-eval timed out after {spec.timeout_s:.0f} s: {explain(log_path, last=True)}") from None
        except BaseException:
            _kill(proc)
            raise
    if code != 0:
        raise EvalError(f"lm-eval exited with {code}: {explain(log_path, last=True)}")
    metrics = parse_results(out_dir, spec.tasks)
    metrics[M.EVAL_S] = time.monotonic() - t0
    progress(
        f"accuracy {metrics.get(M.ACCURACY, float('nan')):.3f} "
        f"(+/- {metrics.get(M.ACCURACY_STDERR, float('nan')):.3f}) in {metrics[M.EVAL_S]:.0f}s"
    )
    return metrics


def _guard(pgid: int) -> None:
    """The engine servers' watchdog (``orchestrator.engines.watchdog``, run as a program) over
    lm-eval's process group: if this process dies without stopping it (a Ray worker killed, the
    node's OOM killer), lm-eval is stopped instead of retrying against a server that is gone."""
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.engines.watchdog", str(os.getpid()), str(pgid)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    watchdog.wait(timeout=30)  # it forks a detached watcher and exits at once


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


__all__ = ["EvalError", "eval_argv", "local_task_names", "parse_results", "run_eval"]
