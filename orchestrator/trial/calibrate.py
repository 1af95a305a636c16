"""The lab's baseline server calibrated on this machine: its decode step and its prefill time
per prompt token (:class:`~orchestrator.perf.sizing.EngineSpeed`), for sizing the lab's workload
(:mod:`orchestrator.scheduling.sizing`).

One server of the baseline trial starts (the same clean-slate check and the same stop on every
way out as a trial's), takes a warm-up request, then one request at a time: prompts of the two
probe lengths with one output token each (their TTFTs give the line of prefill time over
length) and short prompts with 64 output tokens (their median time between tokens is the
decode step). It takes ~30 s here, and is cached per machine, engine and version, model and the
engine's settings that change its speed (``~/.cache/inference-lab/engine-speed.json``).

A calibration counts the CPU the machine spent on anything but its server, this process and
the sweep's own machinery while it measured (:class:`OtherWork`): where that was over :data:`BUSY_CORES` (a test run, a
build, a neighbour's steal beside it), the numbers size the sweep that measured them, and the
line says so, but they are not cached, so a slow reading does not size every later lab."""

from __future__ import annotations

import contextlib
import hashlib
import json
import statistics
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import psutil

from orchestrator.config.logs import Progress
from orchestrator.config.paths import cache_root, cached_entry, keep_entry
from orchestrator.config.schema import TrialSpec
from orchestrator.engines import adapter_for
from orchestrator.loadgen.api import Endpoint, PlannedRequest, completions_delta, completions_payload
from orchestrator.loadgen.prompts import prompt_factory
from orchestrator.metrics import census, host
from orchestrator.models import resolve_model, resolve_tokenizer
from orchestrator.perf.sizing import SPEED_CACHE, EngineSpeed
from orchestrator.trial.servers import start_servers
from orchestrator.trial.slate import wait_for_clean_slate

CACHE = cache_root() / SPEED_CACHE
REPEATS = 3  # requests per probe length; the median is taken
DECODE_TOKENS = 64
# Other work's CPU during a calibration (cores) above which its numbers are not cached. An idle
# machine here reads ~0.0x (Ray's daemons, the kernel).
BUSY_CORES = 0.25
# How long a calibration is used for. The same VM here read 0.491 ms per prompt token and a 9.6 ms
# decode step (2026-12-06, early), 0.820 and 13.2 ms (09:02 that day) and 0.93-1.07 and 13-14 ms
# (2026-12-07 03:20, nothing beside it): its host's speed drifts within a day, and a lab sized on an
# old reading asks the wrong sizes. A real run recalibrates past this age (~30 s); a dry run uses
# any age, and says it.
MAX_AGE_S = 6 * 3600.0


def _steal_s() -> float:
    """CPU seconds the hypervisor has taken from this machine's cores (0 where not reported)."""
    return float(getattr(psutil.cpu_times(), "steal", 0.0))


class OtherWork:
    """The CPU the machine spends on anything but ``pids``' trees, this process and the sweep's
    own machinery, from its creation to :meth:`cores` (in cores: seconds of CPU per second): a
    load point's foreign CPU (:func:`census.foreign_cpu`) with the hypervisor's steal added (a
    neighbour's work slows the calibration as much as ours)."""

    def __init__(self, pids: Iterable[int]) -> None:
        self.pids = list(pids)
        self.t0, self.before, self.steal0 = time.monotonic(), census.snapshot(), _steal_s()

    def cores(self) -> float:
        wall = max(time.monotonic() - self.t0, 1e-9)
        foreign = census.foreign_cpu(self.before, census.snapshot(), wall, census.tree(self.pids))
        return float(foreign["cores"]) + max(_steal_s() - self.steal0, 0.0) / wall  # type: ignore[arg-type]


def speed_key(spec: TrialSpec, probe_tokens: tuple[int, int]) -> tuple[str, dict[str, object]]:
    """The cache's key for ``spec``'s server on this machine, and what it is made of."""
    engine = spec.engine
    parts: dict[str, object] = {
        "machine": host.describe([])["summary"],
        "engine": engine.name,
        "version": adapter_for(engine.name).version(spec),
        "model": spec.model.model_dump(mode="json"),  # a tiny model has no path: its spec tells it apart
        "dtype": getattr(engine, "dtype", None),
        "quantization": getattr(engine, "quantization", None),
        "threads": getattr(engine, "cpu_omp_threads_bind", None),
        "cpus": spec.platform.cpus_per_trial,
        "probe_tokens": list(probe_tokens),
    }
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16], parts


def cached_speed(key: str, path: Path | None = None) -> EngineSpeed | None:
    """The cached speed of ``key``; None where there is none, or where it was kept before a
    calibration read the machine's other work (it may have been measured beside some)."""
    entry = cached_entry(path or CACHE, key)
    if entry is None or "other_cores" not in entry:
        return None
    try:
        return EngineSpeed.from_dict(entry)
    except (KeyError, TypeError, ValueError):
        return None


def keep_speed(key: str, speed: EngineSpeed, path: Path | None = None) -> None:
    """Add ``speed`` to the cache."""
    keep_entry(path or CACHE, key, speed.as_dict())


def _stream(endpoint: Endpoint, prompt: str, tokens: int, input_tokens: int) -> list[float]:
    """One streamed completion: the arrival time of each text chunk after the send (seconds)."""
    req = PlannedRequest(0, "calibration", prompt, input_tokens, tokens)
    body = json.dumps(completions_payload(endpoint, req, ignore_eos=True)).encode()
    http = urllib.request.Request(endpoint.base_url + "/v1/completions", body, endpoint.headers(), method="POST")
    times: list[float] = []
    t0 = time.perf_counter()
    with urllib.request.urlopen(http, timeout=300) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            if completions_delta(json.loads(line[5:])) is not None:  # a token chunk (its text may be empty)
                times.append(time.perf_counter() - t0)
    if not times:
        raise RuntimeError(f"calibration: the server streamed no token for a {input_tokens}-token prompt")
    return times


def measure(endpoint: Endpoint, spec: TrialSpec, model_path: str, probe_tokens: tuple[int, int]) -> dict[str, float]:
    """The probes against a running server, one request at a time: TTFT per probe length (median
    of :data:`REPEATS`) and the decode step (median time between tokens)."""
    factory = prompt_factory(resolve_tokenizer(spec.model, model_path))
    rng = np.random.default_rng(spec.seed)  # fresh random prompts: no prefix of one is cached for another
    _stream(endpoint, factory.prompt(probe_tokens[0], rng), 4, probe_tokens[0])  # warm-up
    ttft: dict[int, list[float]] = {n: [] for n in probe_tokens}
    gaps: list[float] = []
    for _ in range(REPEATS):
        for n in probe_tokens:
            ttft[n].append(_stream(endpoint, factory.prompt(n, rng), 1, n)[0] * 1000)
        times = _stream(endpoint, factory.prompt(16, rng), DECODE_TOKENS, 16)
        gaps += [(b - a) * 1000 for a, b in zip(times, times[1:])]
    short, long = (statistics.median(ttft[n]) for n in probe_tokens)
    per_token = max((long - short) / (probe_tokens[1] - probe_tokens[0]), 1e-6)
    return {
        "decode_step_ms": statistics.median(gaps),
        "prefill_ms_per_token": per_token,
        "prefill_fixed_ms": max(short - per_token * probe_tokens[0], 0.0),
    }


def one_server(spec: TrialSpec) -> TrialSpec:
    """``spec`` with its engine as one server: a P/D pair's or a router's replicas' engine alone.
    A lab's sizes are set against one server's speed (the P/D lab's rate keeps *the standard
    server* prefilling a share of the time), and the cache's key does not tell a pair from a
    server, so a pair measured through its proxy would size every later lab of that engine."""
    engine = spec.engine
    parts = {name: None for name in ("disaggregation", "router") if getattr(engine, name, None) is not None}
    if not parts:
        return spec
    return spec.model_copy(update={"engine": engine.model_copy(update=parts)})


def measure_speed(spec: TrialSpec, workdir: Path, probe_tokens: tuple[int, int], say: Progress) -> EngineSpeed:
    """Start ``spec``'s server, measure it (:func:`measure`), stop it."""
    adapter = adapter_for(spec.engine.name)
    model_path = resolve_model(spec.model)
    workdir.mkdir(parents=True, exist_ok=True)
    wait_for_clean_slate(spec, [], say)
    with contextlib.ExitStack() as stack:
        group, _ = start_servers(
            stack, adapter, spec, model_path, workdir, [], lambda name, _: workdir / f"server-{name}.log", say
        )
        view = group.view()
        endpoint = Endpoint(view.front_url, spec.model.name, api_key=adapter.api_key(spec))
        others = OtherWork(view.pids)
        numbers = measure(endpoint, spec, model_path, probe_tokens)
        other_cores = others.cores()
    return EngineSpeed(
        **numbers,
        probe_tokens=probe_tokens,
        machine=host.describe([])["summary"],
        engine=f"{spec.engine.name} {adapter.version(spec)}",
        model=spec.model.name,
        measured_at=time.time(),
        other_cores=round(other_cores, 3),
    )


def engine_speed(
    spec: TrialSpec, workdir: Path, probe_tokens: tuple[int, int], say: Progress, again: bool = False
) -> tuple[EngineSpeed, bool]:
    """This machine's speed for ``spec``'s server: cached within :data:`MAX_AGE_S`, else measured
    now and cached; and whether it was measured now. A P/D pair or replicas behind a router are
    measured as one server of their engine (:func:`one_server`)."""
    alone = one_server(spec)
    key, _ = speed_key(alone, probe_tokens)
    known = None if again else cached_speed(key)
    if known is not None and (age := time.time() - known.measured_at) < MAX_AGE_S:
        return known, False
    why = f"the cached one is {age / 3600:.0f} h old" if known is not None else "once"
    whose = f"{spec.variant or 'the baseline'}'s " + ("server" if alone is spec else "engine as one server")
    say(f"sizing: calibrating {whose} on this machine (~30 s, {why}: kept for {MAX_AGE_S / 3600:.0f} h in {CACHE})")
    speed = measure_speed(alone, workdir, probe_tokens, say)
    if speed.other_cores > BUSY_CORES:
        say(
            f"sizing: other work used {speed.other_cores:.2f} cores of this machine while it was calibrated "
            f"(more than {BUSY_CORES}): its numbers size this sweep only and are not cached"
        )
    else:
        keep_speed(key, speed)
    return speed, True
