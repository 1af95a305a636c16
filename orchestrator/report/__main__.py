"""Rebuild a sweep's report from MLflow alone.

    python -m orchestrator.report experiment=first_serving
    python -m orchestrator.report experiment=chunked_prefill tracking.uri=http://mlflow:5000 sweep=RUN_ID out=DIR
    python -m orchestrator.report experiment=NAME log=true     # also log it to the sweep's run

Arguments are key=value: experiment (required), tracking.uri (default: the project's
sqlite store, as conf/tracking/sqlite.yaml), sweep (a sweep run id; default the latest
sweep with trial runs), out (default reports/<experiment>), log (true: log the files to
the sweep's parent run under report/), delta (accuracy tolerance for "best", 0.01).
"""

from __future__ import annotations

import sys
from pathlib import Path

KEYS = ("experiment", "tracking.uri", "sweep", "out", "log", "delta")
ROOT = Path(__file__).resolve().parents[2]


def parse(argv: list[str]) -> dict[str, str]:
    args = {}
    for a in argv:
        key, sep, value = a.lstrip("+").partition("=")
        if not sep or key not in KEYS:
            raise SystemExit(f"error: expected key=value with key in {', '.join(KEYS)}; got {a!r}")
        args[key] = value
    if "experiment" not in args:
        raise SystemExit("error: experiment=NAME is required (the MLflow experiment of the sweep)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    from orchestrator.report import build_report, from_mlflow
    from orchestrator.tracking.mlflow_tracker import DEFAULT_TRACKING_URI

    uri = args.get("tracking.uri") or DEFAULT_TRACKING_URI
    try:
        data = from_mlflow(uri, args["experiment"], args.get("sweep"))
    except LookupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.get("out") or ROOT / "reports" / args["experiment"])
    files = build_report(data, out, float(args.get("delta", 0.01)))
    for f in files:
        print(f"wrote {f}")
    if args.get("log", "false").lower() in ("1", "true", "yes"):
        if not data.sweep_run_id:
            print("error: log=true: this report has no sweep run to log to", file=sys.stderr)
            return 2
        from orchestrator.tracking import MlflowTracker

        MlflowTracker(uri, args["experiment"]).log_sweep_files(files, "report", run_id=data.sweep_run_id, root=out)
        print(f"logged {len(files)} file(s) to run {data.sweep_run_id} under report/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
