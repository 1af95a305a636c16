"""Push a sweep's results from disk to MLflow: for sweeps that ran while MLflow was down.

    python -m orchestrator.sync multirun/chunked_prefill/2026-11-22_15-41-00
    python -m orchestrator.sync SWEEP_DIR tracking.uri=http://mlflow.internal:5000 experiment=NAME

Every trial result under ``SWEEP_DIR/trials/*/`` whose ``result_id`` (trial hash + start
time) is not in the experiment yet is logged, under the sweep's own parent run when MLflow
has it (tag ``sweep_dir``), else under a new sweep run for that folder. Replaying twice logs
nothing the second time: no duplicates.
"""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator.metrics.result import RESULT_FILE, load_result
from orchestrator.tracking import MlflowTracker, result_id
from orchestrator.tracking.store import DEFAULT_TRACKING_URI


def sync(sweep_dir: Path, uri: str, experiment: str | None = None, progress=print) -> tuple[int, int]:
    """Log the sweep's results that MLflow lacks; returns (logged, already there)."""
    dirs = sorted(p.parent for p in sweep_dir.glob(f"trials/*/{RESULT_FILE}"))
    if not dirs:
        raise FileNotFoundError(f"no trial results under {sweep_dir}/trials/")
    results = [(d, load_result(d)) for d in dirs]
    name = experiment or results[0][1].experiment
    tracker = MlflowTracker(uri, name)
    known = tracker.logged_result_ids()
    todo = [(d, r) for d, r in results if result_id(r) not in known]
    if todo and tracker.attach_sweep(str(sweep_dir)) is None:
        tracker.start_sweep(
            f"sync:{sweep_dir.name}",
            {"experiment": name, "num_trials": len(results)},
            {"sweep_dir": str(sweep_dir), "synced": "true"},
        )
        tracker.end_sweep({}, "FINISHED")
    for d, r in todo:
        tracker.log_trial(r, d, {"synced": "true"})
        progress(f"logged {d.name}: {r.status}")
    progress(
        f"sync of {sweep_dir}: {len(todo)} logged, {len(results) - len(todo)} already in experiment '{name}' at {uri}"
    )
    return len(todo), len(results) - len(todo)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    dirs = [a for a in args if "=" not in a]
    opts = dict(a.split("=", 1) for a in args if "=" in a)
    unknown = sorted(set(opts) - {"tracking.uri", "experiment"})
    if len(dirs) != 1 or unknown:
        print(
            "usage: python -m orchestrator.sync SWEEP_DIR [tracking.uri=URI] [experiment=NAME]"
            + (f"\nunknown option(s): {', '.join(unknown)}" if unknown else ""),
            file=sys.stderr,
        )
        return 2
    uri = opts.get("tracking.uri") or DEFAULT_TRACKING_URI
    try:
        sync(Path(dirs[0]).resolve(), uri, opts.get("experiment"))
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
