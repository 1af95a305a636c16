"""Running trials as Ray tasks: resources per trial, a cap on concurrent trials, retries of
trials lost with their worker or node (their attempts: :mod:`.attempts`), Ctrl-C handling."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config.logs import mark
from orchestrator.config.schema import ClusterSpec
from orchestrator.config.secrets import hide, redact_mapping, redact_override
from orchestrator.engines.process import interrupts_stop_servers, on_interrupt
from orchestrator.metrics.census import DRIVER_ENV
from orchestrator.metrics.result import TrialResult
from orchestrator.scheduling.attempts import Attempts, note_attempt, retried
from orchestrator.scheduling.jobs import TrialJob

log = logging.getLogger(__name__)


def _worker_start(workdirs: list[str]) -> tuple[list[int], str]:
    """In the worker: the GPUs Ray assigned (they go to the servers) and this node's id, which
    each trial folder notes first (the driver reads it if the attempt is lost)."""
    import ray

    mark("trial task started in its worker")
    node = ray.get_runtime_context().get_node_id()
    for workdir in workdirs:
        note_attempt(workdir, node)
    return [int(g) for g in ray.get_gpu_ids()], node


def _run_trial_task(spec_json: str, workdir: str, overrides: list[str]) -> dict[str, Any]:
    """Body of the Ray task of one trial (runs in a worker)."""
    from orchestrator.config.schema import TrialSpec
    from orchestrator.trial import run_trial

    gpu_ids, node = _worker_start([workdir])
    with interrupts_stop_servers():  # a cancel TERMs the servers first
        result = run_trial(TrialSpec.model_validate_json(spec_json), workdir, overrides, gpu_ids)
    result.hardware["ray_node_id"] = node  # where it ran
    return result.model_dump()


def _prepare_worker(tokenizers: list[str]) -> None:
    """Body of a worker's preparation task: the imports and prompt factories its trials need."""
    from orchestrator.loadgen.prompts import prompt_factory
    from orchestrator.trial import run_trial  # noqa: F401  (the trial's own imports)

    for tokenizer in tokenizers:
        try:
            prompt_factory(tokenizer)
        except Exception as exc:  # the trial loads it again and says what is wrong
            log.debug("preparing %s: %s", tokenizer, exc)
    mark("worker prepared")


def prepare_workers(jobs: list[TrialJob]) -> list[Any]:
    """Start preparing a worker for the sweep's trials (imports, the tokenizers of models that
    are already on disk) while the driver still opens MLflow: a task that holds no CPU, run by
    the job's first worker, which the first trial then finds ready (benchmarks/quick_start).
    Returns its ObjectRef (nothing waits for it)."""
    import ray

    from orchestrator.models import resolve_model, resolve_tokenizer

    tokenizers: list[str] = []
    for job in jobs[:8]:
        path = resolve_tokenizer(job.spec.model, resolve_model(job.spec.model, build=False))
        if Path(path).is_dir() and path not in tokenizers:
            tokenizers.append(path)
    task: Any = ray.remote(num_cpus=0, max_retries=0)(_prepare_worker)
    return [task.options(name="prepare-worker").remote(tokenizers)]


def _run_group_task(specs_json: list[str], workdirs: list[str], overrides: list[list[str]]) -> list[dict[str, Any]]:
    """Body of the Ray task of trials sharing one server start (``trial.run_trial_group``)."""
    from orchestrator.config.schema import TrialSpec
    from orchestrator.trial import run_trial_group

    gpu_ids, node = _worker_start(workdirs)
    items = [(TrialSpec.model_validate_json(s), w, o) for s, w, o in zip(specs_json, workdirs, overrides)]
    with interrupts_stop_servers():
        results = run_trial_group(items, gpu_ids)
    for result in results:
        result.hardware["ray_node_id"] = node
    return [r.model_dump() for r in results]


def group_jobs(jobs: list[TrialJob], key: Callable[[TrialJob], str | None] | None) -> list[list[TrialJob]]:
    """Units of work, in job order: jobs with the same (non-None) key form one unit."""
    if key is None:
        return [[job] for job in jobs]
    units: list[list[TrialJob]] = []
    by_key: dict[str, list[TrialJob]] = {}
    for job in jobs:
        k = key(job)
        if k is None:
            units.append([job])
        elif k in by_key:
            by_key[k].append(job)
        else:
            by_key[k] = [job]
            units.append(by_key[k])
    return units


@dataclass
class RayContext:
    started_here: bool

    def shutdown(self) -> None:
        import ray

        if self.started_here and ray.is_initialized():
            if _kept is not None:  # inside ray_kept_between_sweeps: stopped at the block's end
                _kept.append(self)
                return
            ray.shutdown()


_kept: list[RayContext] | None = None  # the Ray contexts whose stop waits for the block's end


@contextmanager
def ray_kept_between_sweeps() -> Iterator[None]:
    """The sweeps run in this block, one after another in this driver (a search's batches), share
    one Ray: the first starts it (or connects), the next ones find it up (``init_ray``), and a Ray
    started here stops when the block ends, on every exit path. A local Ray's start is ~5 s of
    each batch on a 2-core machine."""
    global _kept
    outer, _kept = _kept, []
    try:
        yield
    finally:
        kept, _kept = _kept, outer
        if kept:
            kept[0].shutdown()  # the Ray started in the block: stopped now, or deferred to an enclosing block


def init_ray(cluster: ClusterSpec) -> RayContext:
    """Connect to ``cluster.address`` or start a local Ray with the given CPUs/GPUs."""
    import ray

    if ray.is_initialized():
        return RayContext(started_here=False)
    kwargs: dict[str, Any] = {
        "include_dashboard": cluster.include_dashboard,
        "log_to_driver": True,
        "configure_logging": True,
        "logging_level": logging.WARNING,
    }
    # Workers import the orchestrator from this same environment (editable install).
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # progress lines stay plain text in log files
    # Ray starts workers at nice 15 by default; the engine server inherits it and would lose
    # the CPU to anything else on the node. Only takes effect for a Ray started here.
    os.environ.setdefault("RAY_worker_niceness", "0")
    # Trials on this machine count the driver's CPU as the sweep's, not a stranger's (metrics.census).
    os.environ[DRIVER_ENV] = str(os.getpid())
    if os.environ.get("INFERENCE_LAB_TIMING"):  # workers of a running cluster log their phases too
        kwargs["runtime_env"] = {"env_vars": {"INFERENCE_LAB_TIMING": os.environ["INFERENCE_LAB_TIMING"]}}
    if cluster.address:
        ray.init(address=cluster.address, **kwargs)
    else:
        # address="local": always a new local Ray. Without it, ray.init() joins the cluster named
        # in /tmp/ray/ray_current_cluster (or RAY_ADDRESS), even a dead one left by a killed
        # `ray start`, and retries connecting to it for minutes.
        with _interrupts_after_start() as interrupted:
            ray.init(address="local", num_cpus=cluster.num_cpus, num_gpus=cluster.num_gpus, **kwargs)
        if interrupted:
            ray.shutdown()
            raise KeyboardInterrupt(f"signal {interrupted[0]} while Ray was starting")
    return RayContext(started_here=True)


@contextmanager
def _interrupts_after_start() -> Iterator[list[int]]:
    """A Ctrl-C or SIGTERM while a local Ray starts waits for the start to end (a few seconds), so
    that Ray can be stopped whole: interrupted inside ``ray.init``, the processes it had started
    (its raylet's agents) are known to no one and outlive the driver. The signals received are in
    the list yielded; a second one interrupts at once."""
    received: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if received:
            raise KeyboardInterrupt(f"signal {signum}")
        received.append(signum)
        print("interrupted while Ray starts: stopping it once started (again to stop now)", file=sys.stderr)

    with on_interrupt(handler):
        yield received


def cluster_gpus() -> int:
    """GPUs the connected Ray cluster has in total (logical GPUs for a local Ray)."""
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


def largest_node_cpus() -> float | None:
    """The most CPUs one live node of the connected Ray cluster offers (None: none reported)."""
    import ray

    cpus = [float(n.get("Resources", {}).get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")]
    return max(cpus) if cpus else None


def run_jobs(
    jobs: list[TrialJob],
    workdir_of: Callable[[TrialJob], str],
    max_concurrent: int | None,
    task: Callable[[str, str, list[str]], dict[str, Any]] = _run_trial_task,
    max_attempts: int = 1,
    progress: Callable[[str], None] = print,
    share_key: Callable[[TrialJob], str | None] | None = None,
    submitted: Callable[[], None] | None = None,
) -> Iterator[tuple[TrialJob, TrialResult]]:
    """Submit trials as Ray tasks (at most ``max_concurrent`` at once); yield results as they finish.
    ``submitted`` is called once, when the first tasks are submitted.

    Each task asks Ray for the trial's GPUs (``num_gpus``) and CPUs; ``task`` is the body
    run in the worker (the real trial; tests put a probe of the same placement there).

    A trial lost with its worker or node (:data:`.attempts.LOST`) is submitted again, up to
    ``max_attempts`` in all; each attempt is listed in the result's ``attempts`` and what a
    lost attempt wrote is kept in ``attempt-N/`` of its folder. Trials that fail by
    themselves are not retried.

    Jobs with the same ``share_key`` (``trial.server_key``: identical servers) run as one
    task, one after the other on one server start (``trial.run_trial_group``).

    On Ctrl-C (or any exception in the caller) pending tasks are cancelled, which raises
    KeyboardInterrupt inside each worker so its server is stopped on the way out.
    """
    import ray

    submit = _submitter(task, workdir_of)
    # Largest trials first (stable otherwise): small trials submitted ahead of a 4-GPU one
    # would take every GPU as it frees and starve it, stretching the sweep.
    queue = sorted(group_jobs(jobs, share_key), key=lambda unit: -unit[0].num_gpus)
    running: dict[Any, list[TrialJob]] = {}
    attempts: dict[int, Attempts] = {job.index: Attempts() for job in jobs}
    try:
        while queue or running:
            while queue and (max_concurrent is None or len(running) < max_concurrent):
                unit = queue.pop(0)
                running[submit(unit)] = unit
            if submitted is not None:  # once
                then = submitted
                submitted = None
                then()
            # Short waits: a blocking ray.wait would keep Ctrl-C / SIGTERM from reaching Python.
            done, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
            for ref in done:
                unit = running.pop(ref)
                value, error = _fetch(ref)  # once: a result carries its records, worth not copying twice
                if retried(unit, error, attempts, max_attempts, workdir_of, progress):
                    queue.insert(0, unit)
                    continue
                for job, result in zip(unit, _results_of(unit, value, error)):
                    if error is not None:  # the task died: its worker could not scrub the trial's raw logs
                        _scrub_lost_logs(workdir_of(job), job)
                    yield job, attempts[job.index].final(result)
    finally:
        _stop_running(list(running))


def _submitter(
    task: Callable[[str, str, list[str]], dict[str, Any]], workdir_of: Callable[[TrialJob], str]
) -> Callable[[list[TrialJob]], Any]:
    """Submits a unit of jobs (one trial, or trials sharing a server) as one Ray task asking for
    the first job's CPUs and GPUs; returns its ObjectRef."""
    import ray

    remote: Any = ray.remote(max_retries=0)(task)  # each returns its own ObjectRef type
    group_remote: Any = ray.remote(max_retries=0)(_run_group_task)

    def submit(unit: list[TrialJob]) -> Any:
        job = unit[0]
        opts: dict[str, Any] = {"num_cpus": job.spec.platform.cpus_per_trial, "num_gpus": job.num_gpus}
        if len(unit) == 1:
            return remote.options(**opts, name=f"trial:{job.label}"[:100]).remote(
                job.spec.model_dump_json(), workdir_of(job), job.overrides
            )
        return group_remote.options(**opts, name=f"trials:{job.label}+{len(unit) - 1}"[:100]).remote(
            [j.spec.model_dump_json() for j in unit], [workdir_of(j) for j in unit], [j.overrides for j in unit]
        )

    return submit


def _stop_running(refs: list[Any], grace_s: float = 5.0) -> None:
    """Ask running trials to stop, then force them: a force-cancelled worker dies at once and
    its server's watchdog stops the server. Points measured so far are already on disk."""
    import ray

    if not refs:
        return
    for ref in refs:
        ray.cancel(ref, force=False)
    done, pending = ray.wait(refs, num_returns=len(refs), timeout=grace_s)
    for ref in pending:
        try:
            ray.cancel(ref, force=True)
        except Exception as exc:  # already finished or gone: nothing left to stop
            log.debug("force cancel: %s", exc)


def _fetch(ref: Any) -> tuple[Any, Exception | None]:
    """A finished task's value, or the Ray error it ended with (worker died, cancelled, ...)."""
    import ray

    try:
        return ray.get(ref), None
    except ray.exceptions.RayError as exc:
        return None, exc


def _scrub_lost_logs(workdir: str, job: TrialJob) -> None:
    from orchestrator.trial.scrub import scrub_logs, trial_secrets

    if Path(workdir).is_dir():  # on this node's disk (a shared one, or the driver's own node)
        scrub_logs(Path(workdir), trial_secrets(job.spec))


def _results_of(unit: list[TrialJob], value: Any, error: Exception | None) -> list[TrialResult]:
    """The unit's results, in job order (a group task returns one per job)."""
    if error is not None:
        from orchestrator.trial.scrub import trial_secrets

        now = time.time()
        return [
            TrialResult(
                trial_hash=job.trial_hash,
                experiment=job.spec.experiment,
                variant=job.spec.variant,
                overrides=[redact_override(o) for o in job.overrides],
                spec=redact_mapping(job.spec.model_dump(mode="json")),
                status="FAILED",
                error=hide(f"{type(error).__name__}: {error}", trial_secrets(job.spec)),  # the API key too
                started_at=now,
                ended_at=now,
            )
            for job in unit
        ]
    values = value if isinstance(value, list) else [value]
    return [TrialResult.model_validate(v) for v in values]
