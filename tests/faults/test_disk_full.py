"""A full disk mid-sweep, on a real small filesystem (a tmpfs mounted by the test; root only,
as in CI): the results' disk stops the sweep with the path and the space needed, loses no
finished trial and half-writes none, MLflow holds nothing the disk lacks, and the same command
after space is freed resumes with no duplicates. The MLflow sqlite store's disk filling costs
nothing measured: the sweep carries on with every result on disk and a sync fills MLflow."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, search_runs

pytestmark = [pytest.mark.faults, pytest.mark.timeout(900)]

TRIALS = 6


@contextlib.contextmanager
def small_filesystem(path: Path, size: str = "16m") -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root needed): {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(folder: Path) -> Path:
    """Write a file until the filesystem is full; returns it (delete it to free the space)."""
    filler = folder / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        except OSError:
            pass
    return filler


def sweep(sweep_dir: Path, store: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "orchestrator",
        "engine=sleep",
        "engine.seconds=1.5",
        f"seed={','.join(str(i) for i in range(TRIALS))}",
        f"tracking.uri={store}",
        f"hydra.sweep.dir={sweep_dir}",
        "-m",
    ]


def run_until(cmd: list[str], marker: str, then) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; when a line starts with ``marker`` call ``then()``; its output (stdout and
    stderr together) as ``stdout``."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    assert proc.stdout is not None
    for line in proc.stdout:
        out.append(line)
        if line.startswith(marker):
            then()
    proc.wait(timeout=600)
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(out), "")


def trial_runs(store: str) -> list:
    return [r for r in search_runs(store, "default") if r.data.tags.get("run_kind") == "trial"]


def test_a_full_results_disk_stops_the_sweep_and_the_same_command_resumes(tmp_path):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    with small_filesystem(tmp_path / "small") as small:
        sweep_dir = small / "sweep"
        cmd = sweep(sweep_dir, store)
        filler: list[Path] = []
        p = run_until(cmd, "[2/", lambda: filler.append(fill(small)) if not filler else None)
        assert p.returncode == 1, p.stdout[-3000:]
        assert "error: no space left to write " + str(sweep_dir) in p.stdout, p.stdout[-2000:]
        assert "stopping the sweep" in p.stdout and "bytes free on its filesystem" in p.stdout
        print(next(line for line in p.stdout.splitlines() if line.startswith("error:")))
        assert not list(sweep_dir.rglob("*.tmp")), "a half-written file was left"
        on_disk = {}
        for f in sweep_dir.glob("trials/*/result.json"):
            r = json.loads(f.read_text())  # whole: it parses
            on_disk[r["trial_hash"]] = r["status"]
        assert 2 <= len(on_disk) < TRIALS and set(on_disk.values()) == {"FINISHED"}, on_disk
        logged = {r.data.tags["trial_hash"] for r in trial_runs(store)}
        assert logged <= set(on_disk), "MLflow holds a trial the disk lacks"

        filler[0].unlink()  # space freed: the same command again
        again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
        assert again.stdout.count("already FINISHED") == len(logged), again.stdout[-3000:]
        print(
            f"{len(on_disk)} trials whole on disk and {len(logged)} in MLflow when the disk filled; the re-run ran the rest"
        )
        runs = trial_runs(store)
        finished = [r for r in runs if r.data.tags.get("trial_status") == "FINISHED"]
        assert len({r.data.tags["trial_hash"] for r in finished}) == TRIALS == len(finished), "duplicates or gaps"


def test_a_full_mlflow_disk_loses_nothing_and_sync_fills_the_gap(tmp_path):
    with small_filesystem(tmp_path / "small") as small:
        store = f"sqlite:///{small}/mlflow.db"
        sweep_dir = tmp_path / "sweep"
        filler: list[Path] = []
        p = run_until(sweep(sweep_dir, store), "[2/", lambda: filler.append(fill(small)) if not filler else None)
        assert p.returncode == 0, p.stdout[-3000:]
        assert f"{TRIALS} FINISHED" in p.stdout and "logging trial" in p.stdout, p.stdout[-3000:]
        assert len(list(sweep_dir.glob("trials/*/result.json"))) == TRIALS  # every result on disk
        filler[0].unlink()
        before = len(trial_runs(store))
        assert before < TRIALS
        print(f"MLflow's disk full: {before} of {TRIALS} trials logged, all {TRIALS} on disk")
        sync = [sys.executable, "-m", "orchestrator.sync", str(sweep_dir), f"tracking.uri={store}"]
        first = subprocess.run(sync, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert first.returncode == 0, first.stderr[-2000:]
        assert f"{TRIALS - before} logged, {before} already" in first.stdout, first.stdout
        runs = trial_runs(store)
        assert len(runs) == TRIALS and len({r.data.tags["trial_hash"] for r in runs}) == TRIALS
