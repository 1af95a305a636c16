"""Two names for one configuration must never get a winner: N whole sweeps, each racing them.

    python -m benchmarks.race_tie [--sweeps 20] [--drift 0.1] [--jitter 0.1] [--max-repeats auto|N]

Each sweep is the CLI a user runs (``python -m orchestrator``, Ray, MLflow in a throw-away sqlite
file) over two trials that differ only in a knob that cannot matter (``workload.request_timeout_s``
300 or 301, which no request comes near; until 2026-12-04 ``workload.warmup_requests`` 0 or 1,
which differs in the client's first request), against a fake server in its own process (testkit/fake_openai_server.py) whose pace
drifts: every ``--drift-every`` seconds the whole server's speed is redrawn (log-normal of
sigma ``--drift``, the between-run noise a race meets on a real machine), and each request's
pace varies by ``--jitter`` on top. The race runs with its defaults (confidence 0.95, margin
10%), ``--max-repeats`` runs at most (``auto``, the default: planned from the noise after the third
run) and a budget that never stops it early. Prints one line per sweep (its
verdict's decision, runs, exit status, wall time) and a table of decisions: "win" is the
failure this benchmark looks for. docs/benchmarks.md keeps the table.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from testkit.fake_openai_server import IsolatedFakeServer, Script
from testkit.races import two_names_sweep


def one_sweep(url: str, folder: Path, max_repeats: str = "3") -> tuple[str, str, int, float]:
    """(decision, the verdict line, exit status, seconds) of one sweep against ``url``."""
    objective = f"{{maximize:tokens_per_second,budget:100,max_repeats:{max_repeats}}}"
    cmd = two_names_sweep(url, f"sqlite:///{folder}/mlflow.db", f"{folder}/multirun", objective)
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=900)
    took = time.monotonic() - t0
    verdict = next((line for line in p.stdout.splitlines() if line.startswith("Verdict:")), "(no verdict)")
    plans = [line.split("race: ", 1)[1] for line in p.stdout.splitlines() if "race: planning " in line]
    if plans:  # the noise the race measured between runs, and the runs it planned for it
        verdict += f" [{plans[-1]}]"
    if " wins" in verdict:
        decision = "win"
    elif " tie within the margin" in verdict:
        decision = "tie"
    elif "undecided" in verdict:
        decision = "undecided"
    else:
        decision = "other"
    return decision, verdict, p.returncode, took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=20)
    ap.add_argument(
        "--drift", type=float, default=0.1, help="sigma of the server's pace, redrawn every --drift-every s"
    )
    ap.add_argument("--drift-every", type=float, default=2.0)
    ap.add_argument("--jitter", type=float, default=0.1, help="sigma of each request's own pace")
    ap.add_argument("--max-repeats", default="auto", help="objective.max_repeats: runs at most, or auto (the default)")
    args = ap.parse_args()
    script = Script(ttft_s=0.01, itl_s=0.004, jitter=args.jitter, drift=args.drift, drift_every_s=args.drift_every)
    decisions: Counter[str] = Counter()
    with IsolatedFakeServer(script) as srv, tempfile.TemporaryDirectory() as tmp:
        for i in range(args.sweeps):
            decision, verdict, rc, took = one_sweep(srv.base_url, Path(tmp) / f"sweep{i}", args.max_repeats)
            decisions[decision] += 1
            print(f"sweep {i + 1}/{args.sweeps}: {decision} (exit {rc}, {took:.0f}s): {verdict[:1200]}", flush=True)
    print()
    print("| sweeps | max_repeats | tie | undecided | win (false) | other | drift | jitter |")
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| {args.sweeps} | {args.max_repeats} | {decisions['tie']} | {decisions['undecided']} | {decisions['win']} | "
        f"{decisions['other']} | {args.drift:g} every {args.drift_every:g}s | {args.jitter:g} |"
    )


if __name__ == "__main__":
    main()
