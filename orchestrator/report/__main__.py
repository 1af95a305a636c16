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
from typing import NoReturn

from orchestrator.config.paths import PROJECT_ROOT

KEYS = ("experiment", "tracking.uri", "sweep", "out", "log", "delta")


def _bad(message: str) -> NoReturn:
    """A mistake in the arguments: its line, exit code 2 (as the sweep's config errors)."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def parse(argv: list[str]) -> dict[str, str]:
    if any(a in ("-h", "--help", "help") for a in argv):
        print(__doc__)
        raise SystemExit(0)
    args = {}
    for a in argv:
        key, sep, value = a.lstrip("+").partition("=")
        if not sep or key not in KEYS:
            _bad(f"error: expected key=value with key in {', '.join(KEYS)}; got {a!r}")
        args[key] = value
    if "experiment" not in args:
        _bad("error: experiment=NAME is required (the MLflow experiment of the sweep)")
    try:
        float(args.get("delta", 0.01))
    except ValueError:
        _bad(f"error: delta: expected a number (an accuracy tolerance such as 0.01), got {args['delta']!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    from mlflow.exceptions import MlflowException

    from orchestrator.config.secrets import redact_text
    from orchestrator.report import build_report, from_mlflow
    from orchestrator.tracking.store import DEFAULT_TRACKING_URI, server_answers, sqlite_file

    uri = args.get("tracking.uri") or DEFAULT_TRACKING_URI
    shown = redact_text(uri)
    db = sqlite_file(uri)
    if db is not None and not db.is_file():  # reading must not create an empty store there
        print(f"error: tracking.uri: no MLflow store at {db} ({shown})", file=sys.stderr)
        return 2
    if not server_answers(uri):
        print(f"error: tracking.uri: the MLflow server at {shown} does not answer", file=sys.stderr)
        return 2
    try:
        data = from_mlflow(uri, args["experiment"], args.get("sweep"))
    except LookupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except MlflowException as exc:  # a URI MLflow cannot read (an unknown scheme, a store it cannot open)
        print(f"error: tracking.uri={shown}: {redact_text(str(exc).splitlines()[0])}", file=sys.stderr)
        return 2
    out = Path(args.get("out") or PROJECT_ROOT / "reports" / args["experiment"])
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
