"""Every lab as a newcomer runs it: each experiment's sweep through the CLI, from the project
root, with the default sweep folder, one after the other; then a table of what happened.

    python -m orchestrator.labs.labs                         # every experiment (make labs)
    python -m orchestrator.labs.labs quantization roofline   # some of them
    python -m orchestrator.labs.labs -- platform=gpu         # overrides for every sweep after --

Each sweep runs as ``python -m orchestrator +experiment=NAME resume=false -m`` (``resume=false``:
a lab is measured again even if the store already holds it). Its console output is shown
and kept in ``multirun/labs/<time>/<NAME>.log``. The table (lab, trials FINISHED / SKIPPED /
FAILED, the verdict, the wall time) is read from what the sweep left on disk (its
``result.json`` files and its console), printed, and written to ``multirun/labs/<time>/labs.md``
with the first line of every FAILED trial's error. A lab whose verdict is undecided after its
race's budget (the sweep's exit code 4) is reported as such, with the runs deciding would need and
about how long they would take here; it is not a failure. Exit code 1 when a sweep failed or a
trial FAILED.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.config.paths import PROJECT_ROOT
from orchestrator.decide.verdict import NOT_TOLD
from orchestrator.scheduling import outcome

# The course's order (../shared/seeds: weeks 1-16, then the workload card), multi-LoRA serving
# (seeds 001/002), then the GPU smoke test.
ORDER = [
    "first_serving",
    "offline_throughput",
    "roofline",
    "paged_attention",
    "prefix_caching",
    "radix_attention",
    "continuous_batching",
    "chunked_prefill",
    "scheduling_policies",
    "cuda_graphs",
    "speculative_decoding",
    "quantization",
    "tensor_parallel",
    "moe",
    "lmcache",
    "disaggregated_pd",
    "serving_workloads",
    "multi_lora",
    "gpu_smoke",
]
RESULTS_LINE = re.compile(r"^sweep '[^']+': \d+ trial\(s\); results in (.+)$")
VERDICT_LINE = re.compile(r"^(Verdict: .*|Best configuration: .*)$")
EXPECT_LINE = re.compile(r"^Expectations: (\d+) observed, (\d+) not observed, (\d+) not measurable here \(of \d+\)$")
CLAIM_LINE = re.compile(r"^\[(observed|not observed|not measurable here)\] .*$")
NEEDS_RUNS = re.compile(r"deciding it needs about (\d+) runs each")


@dataclass
class LabRun:
    """One lab's sweep as it ended."""

    name: str
    returncode: int
    wall_s: float
    log: Path
    sweep_dir: Path | None = None
    counts: Counter[str] = field(default_factory=Counter)
    verdict: str = ""
    failures: list[tuple[str, str]] = field(default_factory=list)  # (trial, first line of its error)
    expected: tuple[int, int, int] | None = None  # the lab's claims: observed, not observed, not measurable here
    claims: list[str] = field(default_factory=list)  # "[status] claim (numbers)"
    runs: Counter[str] = field(default_factory=Counter)  # a configuration's runs (its first, then a race's repeats)

    @property
    def ok(self) -> bool:
        """Nothing failed: an undecided verdict is an outcome of its own, not a failure."""
        return self.returncode in (outcome.OK, outcome.UNDECIDED) and not self.counts.get("FAILED")

    @property
    def outcome(self) -> str:
        """``ok``, ``undecided`` (with what deciding would cost here), or ``NOT OK``."""
        if not self.ok:
            return "NOT OK"
        if self.returncode != outcome.UNDECIDED:
            return "ok"
        m = NEEDS_RUNS.search(self.verdict)
        runs = max(self.runs_each, 1)
        if not m:
            if NOT_TOLD in self.verdict:  # a difference within the noise: no number of runs decides it here
                return f"undecided after {runs} run(s) each; no practical number of runs decides it here"
            return f"undecided after {runs} run(s) each"
        more = max(int(m.group(1)) - runs, 0) * self.wall_s / runs  # a run of every trial per round
        return f"undecided after {runs} run(s) each; deciding needs about {m.group(1)} each (~{outcome.minutes(more)} more here)"

    @property
    def runs_each(self) -> int:
        """The runs of the most-run configuration: its first run and the race's repeats."""
        return max(self.runs.values(), default=0)


def experiments() -> list[str]:
    found = {p.stem for p in (PROJECT_ROOT / "conf" / "experiment").glob("*.yaml")}
    return [n for n in ORDER if n in found] + sorted(found - set(ORDER))


def run_lab(name: str, overrides: list[str], log: Path) -> LabRun:
    """Run one lab's sweep as a user would; its output goes to the console and to ``log``."""
    cmd = [sys.executable, "-m", "orchestrator", f"+experiment={name}", "resume=false", *overrides, "-m"]
    print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
    t0 = time.monotonic()
    lines: list[str] = []
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=PROJECT_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

        stopping: list[int] = []

        def terminated(signum: int, frame: object) -> None:
            # ``kill`` reaches this runner alone (Ctrl-C reaches the sweep's process group too):
            # the sweep gets it, to stop its trials and servers, and this runner waits for it
            # (a second one is passed on too, while it waits)
            proc.send_signal(signal.SIGTERM)
            if not stopping:
                stopping.append(signum)
                raise SystemExit(128 + signum)

        previous = signal.signal(signal.SIGTERM, terminated)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                out.flush()
                sys.stdout.write(line)
                lines.append(line.rstrip("\n"))
            code = proc.wait()
        except BaseException:  # Ctrl-C: the sweep handles SIGINT itself (stops its servers)
            with contextlib.suppress(Exception):  # its last lines, read on: a full pipe would stall its shutdown
                for line in proc.stdout or ():
                    out.write(line)
            proc.wait()
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
    run = LabRun(name, code, time.monotonic() - t0, log)
    read_outcome(run, lines)
    return run


def read_outcome(run: LabRun, lines: list[str]) -> None:
    """Fill ``run`` from the sweep's console lines and the results it wrote to disk."""
    for line in lines:
        m = RESULTS_LINE.match(line.strip())
        if m:
            run.sweep_dir = Path(m.group(1))
        v = VERDICT_LINE.match(line.strip())
        if v and not run.verdict:
            run.verdict = v.group(1)
        e = EXPECT_LINE.match(line.strip())
        if e:
            run.expected = (int(e.group(1)), int(e.group(2)), int(e.group(3)))
        if CLAIM_LINE.match(line.strip()):
            run.claims.append(line.strip())
    if run.sweep_dir is None:
        return
    for result in sorted((PROJECT_ROOT / run.sweep_dir).glob("trials/*/result.json")):
        data = json.loads(result.read_text())
        if data.get("repeat_of"):  # a race's later run: counted with its configuration
            run.runs[data["repeat_of"]] += 1
            continue
        run.runs[data["trial_hash"]] += 1
        run.counts[data["status"]] += 1
        if data["status"] == "FAILED":
            error = (data.get("error") or "").splitlines()
            run.failures.append((data.get("variant") or data["trial_hash"][:8], error[0] if error else ""))


def table(runs: list[LabRun]) -> list[str]:
    """The markdown table of the labs, then every failure's first error line."""
    out = [
        "| lab | FINISHED | SKIPPED | FAILED | verdict | expectations (observed / not / not here) | wall time |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        decided = f"**{r.outcome}**: " if r.outcome.startswith("undecided") else ""
        verdict = decided + r.verdict.replace("|", "/") or (
            f"(sweep exited with {r.returncode})"
            if r.returncode
            else "none: every trial that could run FAILED (below)"
            if not r.counts.get("FINISHED") and r.counts.get("FAILED")
            else "none: no trial runs on this machine"
            if not r.counts.get("FINISHED")
            else ""
        )
        expected = "/".join(map(str, r.expected)) if r.expected else "none declared"
        out.append(
            f"| {r.name} | {r.counts.get('FINISHED', 0)} | {r.counts.get('SKIPPED', 0)} | "
            f"{r.counts.get('FAILED', 0)} | {verdict} | {expected} | {outcome.minutes(r.wall_s)} |"
        )
    total = sum(r.wall_s for r in runs)
    out.append(
        f"| **all {len(runs)}** | {sum(r.counts.get('FINISHED', 0) for r in runs)} | "
        f"{sum(r.counts.get('SKIPPED', 0) for r in runs)} | {sum(r.counts.get('FAILED', 0) for r in runs)} | "
        f"| {'/'.join(str(sum(r.expected[i] for r in runs if r.expected)) for i in range(3))} | {outcome.minutes(total)} |"
    )
    claimed = [r for r in runs if r.claims]
    if claimed:
        out += ["", "What each lab expects, and whether this run observed it:"]
        for r in claimed:
            out += ["", f"{r.name}:", *(f"- {c.replace('|', '/')}" for c in r.claims)]
    failures = [(r.name, t, e) for r in runs for t, e in r.failures]
    failures += [(r.name, "(sweep)", f"exited with {r.returncode}; see {r.log}") for r in runs if r.returncode]
    if failures:
        out += ["", "Failures:", ""] + [f"- {lab} / {trial}: {error}" for lab, trial, error in failures]
    return out


def machine() -> str:
    cpu = (
        next(
            (
                x.split(":", 1)[1].strip()
                for x in Path("/proc/cpuinfo").read_text().splitlines()
                if x.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else "?"
    )
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    overrides = args[args.index("--") + 1 :] if "--" in args else []
    names = args[: args.index("--")] if "--" in args else args
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("labs", nargs="*", help="experiment names (default: every one)")
    chosen = ap.parse_args(names).labs or experiments()
    unknown = sorted(set(chosen) - set(experiments()))
    if unknown:
        print(f"error: no experiment {', '.join(unknown)}; there are: {', '.join(experiments())}", file=sys.stderr)
        return 2
    out_dir = PROJECT_ROOT / "multirun" / "labs" / dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    runs: list[LabRun] = []
    started = dt.datetime.now()
    for i, name in enumerate(chosen, 1):
        run = run_lab(name, overrides, out_dir / f"{name}.log")
        runs.append(run)
        print(
            f"=== [{i}/{len(chosen)}] {name}: {run.outcome}, {dict(run.counts)} in {outcome.minutes(run.wall_s)}",
            flush=True,
        )
    lines = [
        f"Labs run {started:%Y-%m-%d %H:%M} on {machine()}"
        + (f" with {' '.join(overrides)}" if overrides else "")
        + ":",
        "",
        *table(runs),
    ]
    (out_dir / "labs.md").write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines) + f"\n\n(also in {out_dir / 'labs.md'})", flush=True)
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
