"""Trials that share one server start (:func:`~orchestrator.trial.servers.server_key`): run one
after the other on the first trial's servers, each with its own result."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Sequence

from orchestrator.config.errors import ConfigError, InfeasibleConfigError, ServerCrashedError, TrialError
from orchestrator.config.logs import Progress, print_progress
from orchestrator.config.schema import TrialSpec
from orchestrator.metrics.result import TrialResult, TrialStatus, save_result
from orchestrator.trial.run import TrialRun, outcome, run_trial
from orchestrator.trial.servers import shared_server_spec


def run_trial_group(
    items: Sequence[tuple[TrialSpec, str | os.PathLike[str], list[str]]],
    gpu_ids: list[int] | None = None,
    progress: Progress = print_progress,
) -> list[TrialResult]:
    """Trials with one :func:`server_key` run one after the other on one server start (the
    first trial's); each keeps its own result. Prefix caches are emptied between trials. If
    the shared server dies, the trials after it run on fresh servers of their own."""
    gpus = list(gpu_ids or [])
    runs = [TrialRun(spec, wd, ov, gpus, progress) for spec, wd, ov in items]
    lead = runs[0]
    between_trials = lead.adapter.cache_reset(shared_server_spec(lead.spec))
    results: list[TrialResult] = []
    started = False
    try:
        with contextlib.ExitStack() as stack:
            # last out: once the shared servers are stopped, their raw logs lose their secrets
            for run in runs:
                stack.callback(run.scrub_logs)
            group = lead.start_shared(stack)
            started = True
            for run in runs:
                if results:
                    try:  # alive, its prefix cache emptied
                        group.ready(between_trials)
                    except ServerCrashedError as exc:  # died between trials: the rest start their own
                        lead.say(f"the shared server died between trials ({exc}); the rest run on their own servers")
                        break
                    run.say(f"on the running server of [{lead.label}] (server start saved)")
                    run.base.servers = lead.base.servers
                    run.base.slate = {"checked": False, "note": f"on the running server of [{lead.label}]"}
                results.append(outcome(run, functools.partial(run.measure, group)))
                save_result(results[-1], run.workdir)  # final on disk now, not when the whole group ends
                if run.got.crash is not None:
                    break
    except (TrialError, ConfigError, InfeasibleConfigError) as exc:
        if started:
            raise
        # the shared server never came up: the same happens to every trial of the group
        error = f"{type(exc).__name__}: {exc}"
        status: TrialStatus = "SKIPPED" if isinstance(exc, InfeasibleConfigError) else "FAILED"
        lead.say(f"{status} (and the {len(runs) - 1} trial(s) sharing its server): {error.splitlines()[0]}")
        return [run.result(status, error) for run in runs]
    for run in runs[len(results) :]:
        results.append(run_trial(run.spec, run.workdir, run.overrides, gpus, progress))
    return results
