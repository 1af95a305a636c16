"""``make gpu-check``: every GPU-side path that needs no engine and no network, checked on the
GPU machine it runs on, in about a minute, ending in a PASS / FAIL / SKIP table.

1. detection: the GPUs NVML reports, mapped to the GPU table (:mod:`orchestrator.perf.roofs`);
2. calibration: this node's memory bandwidth and dense matmul rates, cached for the roofline;
3. energy: the telemetry sampler's energy over a window of known matmul load against an
   independent 20 ms reader of the same NVML counter, and the power-integration estimate;
4. the clean slate: a process holding GPU memory (not this one's child) is named, and this
   process's own CUDA context is not; clean again once it exits;
5. the ``gpu_smoke`` plan for the detected GPU (a dry run), where its imports are installed.

It needs Python, torch and nvidia-ml-py, plus the wheels the project's modules import
(pydantic, pydantic-core, annotated-types, typing-inspection, httptools, orjson; docs/gpu.md).
Run: ``python -m orchestrator.gpu_check`` (``--out FILE`` also writes the table as markdown).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config.paths import PROJECT_ROOT


@dataclass
class Row:
    check: str
    status: str  # PASS, FAIL, SKIP
    detail: str
    seconds: float = 0.0


def _run(name: str, fn: Callable[[], tuple[str, str]], rows: list[Row]) -> None:
    t0 = time.perf_counter()
    try:
        status, detail = fn()
    except Exception as exc:  # a check that breaks is a FAIL with its error, never the end of the table
        status, detail = "FAIL", f"{type(exc).__name__}: {exc}"
    rows.append(Row(name, status, detail, time.perf_counter() - t0))
    print(f"[{status}] {name}: {detail} ({rows[-1].seconds:.1f}s)", flush=True)


def check_detection() -> tuple[str, str]:
    from orchestrator.perf.roofs import detect_gpus

    gpus, why = detect_gpus()
    if not gpus:
        return "FAIL", why or "no GPU"
    unknown = [g.name for g in gpus if g.table_name is None]
    words = "; ".join(g.describe() for g in gpus)
    return ("PASS" if not unknown else "FAIL"), words


def check_calibration() -> tuple[str, str]:
    import torch

    from orchestrator.perf.gpus import GPUS
    from orchestrator.perf.roofs import calibrate, detect_gpus, measure_roofs

    if not torch.cuda.is_available():
        return "SKIP", f"torch {torch.__version__} sees no CUDA device"
    gpus, _ = detect_gpus(["0"])
    key = (gpus[0].table_name or gpus[0].name) if gpus else torch.cuda.get_device_name(0)
    roofs, fresh = calibrate(key, lambda: measure_roofs("cuda:0"), again=True)
    table = GPUS.get(key)
    versus = (
        f"; table {table.bandwidth_gb_s:g} GB/s, {table.bf16_tflops:g} TFLOP/s "
        f"(measured {roofs.bandwidth_gb_s / table.bandwidth_gb_s:.0%}, {roofs.bf16_tflops / table.bf16_tflops:.0%})"
        if table
        else ""
    )
    sane = roofs.bandwidth_gb_s > 100 and roofs.bf16_tflops > 10
    return ("PASS" if sane and fresh else "FAIL"), f"{key}: {roofs.describe()}{versus}; cached for the roofline"


def _matmul_load(seconds: float, stop: threading.Event) -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end and not stop.is_set():
        for _ in range(20):
            torch.mm(a, a)
        torch.cuda.synchronize()


def _nvml_reader(nv: Any, h: object, reads: list[tuple[float, ...]], stop: threading.Event) -> None:
    """The independent reading, every 20 ms: NVML's energy counter (J), its power (W, averaged)
    and, where the driver has them, its instant and average power fields (W; NaN where not)."""
    from orchestrator.metrics.telemetry import now

    fields = [nv.NVML_FI_DEV_POWER_INSTANT, nv.NVML_FI_DEV_POWER_AVERAGE]
    while not stop.is_set():
        t = now()
        energy = nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0
        power = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
        extra = [float("nan"), float("nan")]
        try:
            for i, f in enumerate(nv.nvmlDeviceGetFieldValues(h, fields)):
                if f.nvmlReturn == nv.NVML_SUCCESS:
                    extra[i] = f.value.uiVal / 1000.0
        except nv.NVMLError:
            pass
        reads.append((t, energy, power, *extra))
        time.sleep(0.02)


def _energy_windows(load_s: float) -> tuple[list[Any], list[tuple[float, ...]], list[float]]:
    """The telemetry sampler's rows and the 20 ms reader's over three windows, with their edges:
    a steady matmul load of ``load_s``, the decay after it, a 1.5 s burst."""
    from orchestrator.metrics import nvml
    from orchestrator.metrics.probes import NvmlProbe, TelemetrySampler
    from orchestrator.metrics.telemetry import Timeline

    timeline = Timeline()
    sampler = TelemetrySampler([NvmlProbe(["0"])], timeline, interval_s=1.0, budget=0.05)
    nv = nvml.open_session()
    h = nvml.handle(nv, 0)
    reads: list[tuple[float, ...]] = []
    stop, load_stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=_nvml_reader, args=(nv, h, reads, stop), daemon=True)
    thread.start()
    sampler.start()
    time.sleep(1.5)
    edges = [sampler.edge()]
    _matmul_load(load_s, load_stop)
    edges.append(sampler.edge())
    time.sleep(6.0)
    edges.append(sampler.edge())
    _matmul_load(1.5, load_stop)
    edges.append(sampler.edge())
    time.sleep(2.0)
    stop.set()
    thread.join()
    sampler.stop()
    nv.nvmlShutdown()
    return timeline.snapshot(), reads, edges


def check_energy(load_s: float = 6.0, raw: Path | None = None) -> tuple[str, str]:
    """The telemetry sampler's energy over three windows (a steady matmul load, the decay after
    it, a 1.5 s burst) against the 20 ms reader, and the power-integration fallback beside it:
    as a trial's fallback integrates NVML's readings (1 s averages, or instant readings) and as
    trapezoids through them."""
    import torch

    from orchestrator.metrics.telemetry import energy_in_window, integrate, interp_at, power_window, series

    if not torch.cuda.is_available():
        return "SKIP", "no CUDA device"
    rows, reads, edges = _energy_windows(load_s)
    counter, power = series(rows, "gpu0", "energy_j"), series(rows, "gpu0", "power_w")
    window = power_window(rows, "gpu0")  # 0: NVML's power is an instant reading
    ts, vs = [r[0] for r in reads], [r[1] for r in reads]
    if raw is not None:
        raw.write_text(
            json.dumps({"edges": edges, "reads": reads, "sampler_energy": counter, "sampler_power": power}) + "\n"
        )
    as_what = f"{window:g} s averages" if window else "instant readings"
    windows = {"steady": (edges[0], edges[1]), "decay": (edges[1], edges[2]), "burst": (edges[2], edges[3])}
    words, ok = [], True
    for name, (t0, t1) in windows.items():
        ref = interp_at(ts, vs, t1) - interp_at(ts, vs, t0)
        ours, how = energy_in_window(counter, power, t0, t1)
        if ours is None or ref <= 0:
            return "FAIL", f"{name}: no energy over the window ({how})"
        err = ours / ref - 1
        ok = ok and how == "counter" and abs(err) < 0.02
        estimate = energy_in_window(([], []), power, t0, t1, window)[0] or 0.0  # the fallback, as a trial's
        avg = estimate / ref - 1
        trap = integrate(*power, t0, t1) / ref - 1
        words.append(
            f"{name} {t1 - t0:.1f} s: {ref:.0f} J, sampler {err:+.2%} ({how}); power as {as_what} {avg:+.1%}, "
            f"as trapezoids {trap:+.0%}"
        )
    return ("PASS" if ok else "FAIL"), "bf16 matmul vs a 20 ms reader of NVML's counter: " + "; ".join(words)


HOLDER = "import torch, time; x = torch.empty(int(2e9), dtype=torch.uint8, device='cuda'); print('held', flush=True); time.sleep(120)"


def check_slate() -> tuple[str, str]:
    import torch

    from orchestrator.trial.machine import Leftover, gpu_reading

    if not torch.cuda.is_available():
        return "SKIP", "no CUDA device"
    torch.zeros(1, device="cuda")  # this process's own CUDA context: never a leftover
    # a holder that is not our child: a shell starts it in the background and exits
    pid_file = Path(f"/tmp/gpu_check_holder_{os.getpid()}.pid")
    cmd = f'{sys.executable} -c "{HOLDER}" > /dev/null 2>&1 & echo $! > {pid_file}'
    subprocess.run(["sh", "-c", cmd], check=True)
    holder = int(pid_file.read_text().strip())
    try:
        deadline = time.monotonic() + 60
        named: list[Leftover] = []
        leftovers: list[Leftover] = []
        note: str | None = None
        while time.monotonic() < deadline and not named:
            time.sleep(1)
            used, leftovers, note = gpu_reading(["0"])
            named = [x for x in leftovers if x.pid == holder]
        ours = [x for x in leftovers if x.pid == os.getpid()]
        seen = f"named: {named[0].describe()}" if named else f"not named (note: {note})"
    finally:
        os.kill(holder, 9)
        pid_file.unlink(missing_ok=True)
    time.sleep(2)
    after_used, after, after_note = gpu_reading(["0"])
    clean = not [x for x in after if x.pid == holder]
    ok = bool(named) and not ours and clean
    detail = (
        f"a 2 GB holder (pid {holder}) {seen}; own CUDA context listed: {bool(ours)}; clean after it exited: {clean}"
    )
    return ("PASS" if ok else "FAIL"), detail + (f"; {after_note}" if after_note else "")


def check_plan() -> tuple[str, str]:
    try:
        import hydra  # noqa: F401
        import omegaconf  # noqa: F401
    except ImportError as exc:
        return "SKIP", f"the sweep's imports are not installed here ({exc}); carry hydra-core and omegaconf to plan"
    cmd = [sys.executable, "-m", "orchestrator", "+experiment=gpu_smoke", "platform=gpu", "dry_run=json", "-m"]
    p = subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    lines = [x for x in p.stdout.splitlines() if '"gpu_model"' in x]
    if p.returncode != 0 or not lines:
        return "FAIL", (p.stdout + p.stderr)[-400:]
    first = json.loads(lines[0][lines[0].index("{") :])
    return "PASS", f"gpu_model {first.get('gpu_model')} ({first.get('gpu_model_from')}); roofs {first.get('roofs')}"


CHECKS: list[tuple[str, Callable[[], tuple[str, str]]]] = [
    ("GPU detection", check_detection),
    ("roof calibration", check_calibration),
    ("energy: sampler vs independent counter", check_energy),
    ("clean slate with a GPU memory holder", check_slate),
    ("gpu_smoke plan (dry run)", check_plan),
]

# What each check imports (module -> its package): detection needs NVML alone. A machine's own
# install gives torch and nvidia-ml-py; the project's pure-Python imports travel as wheels.
MACHINE = {"torch": "torch", "pynvml": "nvidia-ml-py", "psutil": "psutil"}
WHEELS = {
    "pydantic": "pydantic",
    "pydantic_core": "pydantic-core",
    "annotated_types": "annotated-types",
    "typing_inspection": "typing-inspection",
    "typing_extensions": "typing-extensions",
    "httptools": "httptools",
    "orjson": "orjson",
    "hydra": "hydra-core",
    "omegaconf": "omegaconf",
    "antlr4": "antlr4-python3-runtime",
}
_SCHEMA = ["pydantic", "pydantic_core", "annotated_types", "typing_inspection", "typing_extensions"]
NEEDS: dict[Callable[[], tuple[str, str]], list[str]] = {
    check_detection: ["pynvml"],
    check_calibration: ["torch", "pynvml"],
    check_energy: ["torch", "pynvml", "psutil", *_SCHEMA],
    check_slate: ["torch", "pynvml", "psutil", *_SCHEMA],
    check_plan: [*_SCHEMA, "httptools", "orjson", "hydra", "omegaconf", "antlr4"],
}


def missing_modules(needs: list[str]) -> list[str]:
    """The modules of ``needs`` this interpreter cannot import (found without importing them)."""
    import importlib.util

    out = []
    for name in needs:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(name)
    return out


def what_to_install(missing: list[str]) -> str:
    """One line: what is missing and how to get it here."""
    own = [MACHINE[m] for m in missing if m in MACHINE]
    carried = [WHEELS[m] for m in missing if m in WHEELS]
    parts = []
    if own:
        parts.append(f"{', '.join(own)} (pip install {' '.join(own)})")
    if carried:
        parts.append(
            f"{', '.join(carried)} (the project's wheels: `make gpu-check-wheels` on a machine with the "
            "network writes .whl/; carry .whl/ here and `make gpu-check` installs them)"
        )
    return f"gpu-check: not installed for {sys.executable}: " + "; ".join(parts)


def table(rows: list[Row]) -> str:
    head = "| check | result | detail | s |\n| --- | --- | --- | --- |\n"
    return head + "\n".join(f"| {r.check} | {r.status} | {r.detail} | {r.seconds:.1f} |" for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the table (markdown) here")
    parser.add_argument("--raw", help="also write the energy check's raw NVML reads (JSON) here")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    t0 = time.perf_counter()
    absent = missing_modules(list(dict.fromkeys(m for _, fn in CHECKS for m in NEEDS.get(fn, []))))
    if absent:
        print(what_to_install(absent), flush=True)
    for name, fn in CHECKS:
        lacking = [m for m in NEEDS.get(fn, []) if m in absent]
        if lacking:
            rows.append(Row(name, "SKIP", f"needs {', '.join(lacking)}, not installed here (see above)"))
            print(f"[SKIP] {name}: needs {', '.join(lacking)}", flush=True)
        elif fn is check_energy and args.raw:
            _run(name, lambda: check_energy(raw=Path(args.raw)), rows)
        else:
            _run(name, fn, rows)
    text = table(rows)
    print(f"\n{text}\n\n{time.strftime('%Y-%m-%d')}, {time.perf_counter() - t0:.0f} s")
    if args.out:
        Path(args.out).write_text(text + "\n")
    failed = [r for r in rows if r.status == "FAIL"]
    if failed:
        print("gpu-check: FAILED: " + ", ".join(r.check for r in failed))
    elif absent:
        print(f"gpu-check: incomplete: {', '.join(absent)} not installed (the first line says how to get them)")
    else:
        print("gpu-check: passed")
    return 1 if failed or absent else 0


if __name__ == "__main__":
    sys.exit(main())
