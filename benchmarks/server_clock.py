"""Our client's latencies against the server's own histograms, on the real vLLM CPU server.

    python -m benchmarks.server_clock [--requests 32] [--input 128] [--output 32] [--rate 2]

One trial of the default config (the tiny model on vLLM's CPU build) through ``run_trial``,
the product's own path, at closed-loop concurrency 1 and 8 and at a Poisson rate; per point
the client's TTFT and ITL medians, the server's (vLLM's ``time_to_first_token_seconds`` and
``inter_token_latency_seconds`` bucket deltas, interpolated; the bracket where the median can lie is the resolution),
the gap (client minus server) and the point's verdict. docs/benchmarks.md keeps a table.
"""

from __future__ import annotations

import argparse
import tempfile

from hydra import compose, initialize_config_dir

from orchestrator.config import to_specs
from orchestrator.config.resolvers import register
from orchestrator.trial import run_trial

from .engine_agreement import ROOT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--input", type=int, default=128)
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--rate", type=float, default=2.0)
    a = ap.parse_args()
    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                f"workload.classes={{main:{{input_tokens:{a.input},output_tokens:{a.output}}}}}",
                f"workload.load_points=[{{concurrency:1}},{{concurrency:8}},{{rate:{a.rate}}}]",
                f"workload.num_requests={a.requests}",
                "engine.max_model_len=1024",
            ],
        )
    spec, _ = to_specs(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        result = run_trial(spec, tmp, ["benchmark"])
    if result.status != "FINISHED":
        raise SystemExit(f"trial {result.status}: {result.error}")
    print(f"\n{result.engine_version}; {a.requests} requests per point, {a.input} in / {a.output} out tokens\n")
    head = (
        "point",
        "TTFT p50 client",
        "server [bracket]",
        "gap",
        "ITL p50 client",
        "server [bracket]",
        "gap",
        "verdict",
    )
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for p in result.points:
        m = p.metrics
        cells = [p.label]
        for name in ("ttft", "itl"):
            server = m.get(f"server_{name}_ms_p50")
            cells += [
                f"{m[f'{name}_ms_p50']:.1f} ms",
                "n/a"
                if server is None
                else f"{server:.1f} [{m[f'server_{name}_ms_p50_low']:.0f}-{m[f'server_{name}_ms_p50_high']:.0f}]",
                "n/a" if server is None else f"{m[f'{name}_gap_ms_p50']:+.1f} ms",
            ]
        cells.append("valid" if not m.get("invalid") else "INVALID: " + "; ".join(p.invalid_reasons))
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
