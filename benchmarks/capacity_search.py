"""SLO capacity search vs a dense rate sweep, on a server with a known capacity.

    python -m benchmarks.capacity_search [--slots 8] [--slo-ttft-p99 100] [--probe-s 8]

A fake OpenAI server (``testkit/fake_openai_server.py``, its own process) serves at most
``--slots`` requests at once (the others queue; their wait is part of their TTFT), each
taking ``ttft + tokens x itl`` seconds: it saturates near ``slots / service time`` req/s.
Both sides run through the trial layer (``engine=external``):

* dense: a sweep of Poisson rates in small steps; the capacity is the highest rate that met
  the SLO below the first rate that did not;
* search: one trial with ``workload.capacity`` (bracket, then bisect to 5%).

Prints probes, wall time and the relative error of the search against the dense sweep;
the target (issue 13) is an error <= 5% with <= 8 probes.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from orchestrator.config import to_specs
from orchestrator.config.resolvers import register
from orchestrator.decide.capacity import judge
from orchestrator.trial import run_trial
from testkit.fake_openai_server import FakeServerProcess

ROOT = Path(__file__).resolve().parents[1]


def spec_for(url: str, extra: list[str]):  # type: ignore[no-untyped-def]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        spec, _ = to_specs(
            compose(
                "config",
                overrides=[
                    "engine=external",
                    f"engine.url={url}",
                    "engine.metrics=none",
                    "workload.classes={main:{input_tokens:32,output_tokens:32}}",
                    "workload.warmup_requests=2",
                    "workload.num_requests=null",
                    *extra,
                ],
            )
        )
    return spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--ttft", type=float, default=0.02)
    ap.add_argument("--itl", type=float, default=0.005)
    ap.add_argument("--slo-ttft-p99", type=float, default=100.0)
    ap.add_argument("--probe-s", type=float, default=8.0, help="duration of every load point")
    ap.add_argument("--dense", default="10:50:2.5", help="dense sweep rates lo:hi:step (req/s)")
    a = ap.parse_args()
    register()
    with FakeServerProcess("--ttft", str(a.ttft), "--itl", str(a.itl), "--slots", str(a.slots)) as server:
        url = server.url
        service = a.ttft + 32 * a.itl
        print(
            f"fake server: {a.slots} slots, {service * 1e3:.0f} ms per request -> saturates near "
            f"{a.slots / service:.1f} req/s; SLO ttft_ms_p99 <= {a.slo_ttft_p99:g}; {a.probe_s:g} s per point",
            flush=True,
        )
        slo = {"ttft_ms_p99": a.slo_ttft_p99}
        lo, hi, step = (float(x) for x in a.dense.split(":"))
        rates = [round(lo + i * step, 3) for i in range(int((hi - lo) / step) + 1)]
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.monotonic()
            points = ",".join(f"{{rate:{r:g}}}" for r in rates)
            dense = run_trial(
                spec_for(url, [f"workload.load_points=[{points}]", f"workload.duration_s={a.probe_s}"]),
                Path(tmp) / "dense",
                progress=lambda _: None,
            )
            dense_s = time.monotonic() - t0
            verdicts = [
                (p.setting["rate"], judge(p.metrics, {}, slo, "rate").verdict, p.metrics.get("ttft_ms_p99"))
                for p in dense.points
            ]
            first_fail = next((r for r, v, _ in verdicts if v != "pass"), None)
            truth = max(
                (r for r, v, _ in verdicts if v == "pass" and (first_fail is None or r < first_fail)), default=0.0
            )
            for r, v, ttft in verdicts:
                print(f"  dense r{r:<5g} ttft p99 {ttft:8.1f} ms  {v}", flush=True)
            t0 = time.monotonic()
            cap = (
                "workload.capacity={knob:rate,start:8,high:128,precision:0.05,max_probes:8,"
                f"slo:{{ttft_ms_p99:{a.slo_ttft_p99:g}}},point:{{duration_s:{a.probe_s:g}}}}}"
            )
            found = run_trial(
                spec_for(url, ["workload.load_points=[]", f"workload.duration_s={a.probe_s}", cap]),
                Path(tmp) / "search",
                progress=lambda _: None,
            )
            search_s = time.monotonic() - t0
        for p in found.capacity.get("probes", []):
            print(f"  probe {p['label']:<8s} {p['verdict']:5s} {'; '.join(p['reasons'])}", flush=True)
        est = found.metrics.get("slo_capacity_rps", float("nan"))
        err = abs(est - truth) / truth if truth else float("nan")
        print()
        print(f"{'method':8s} {'points':>6s} {'wall s':>7s} {'capacity req/s':>15s} {'error vs dense':>15s}")
        print(f"{'dense':8s} {len(dense.points):6d} {dense_s:7.0f} {truth:15.2f} {'-':>15s}")
        print(f"{'search':8s} {len(found.capacity.get('probes', [])):6d} {search_s:7.0f} {est:15.2f} {err:15.1%}")
        print(f"search: {found.capacity.get('explanation')}")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
