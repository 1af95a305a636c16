"""How well do trials of different sizes pack onto a cluster's GPUs?

    python -m benchmarks.packing [--gpus 8] [--trials 36] [--seed 0]

A local Ray with fake GPUs runs a mixed sweep of ``sleep`` trials (no server: each holds
1, 2 or 4 GPUs for a seeded random time) through the product's scheduler
(``scheduling.ray_exec.run_jobs``, the same path as real trials). Prints the makespan
against its lower bound (max of total GPU-seconds / GPUs and the longest trial), the
ratio (target <= 1.15), and the orchestration overhead per trial: time inside the worker
beyond the sleep, and the delay until the driver has the result.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
from hydra import compose, initialize_config_dir

from orchestrator.config import to_specs
from orchestrator.config.resolvers import register
from orchestrator.scheduling.jobs import TrialJob
from orchestrator.scheduling.ray_exec import run_jobs
from orchestrator.scheduling.sweep import PROJECT_ROOT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--trials", type=int, default=36)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-s", type=float, default=2.0)
    ap.add_argument("--max-s", type=float, default=8.0)
    a = ap.parse_args()
    import ray

    rng = np.random.default_rng(a.seed)
    sizes = rng.choice([1, 2, 4], size=a.trials, p=[0.5, 0.3, 0.2])
    seconds = rng.uniform(a.min_s, a.max_s, size=a.trials).round(2)
    register()
    jobs = []
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        for i, (g, s) in enumerate(zip(sizes, seconds)):
            overrides = [
                "engine=sleep",
                f"engine.gpus={g}",
                f"engine.seconds={s}",
                "platform=gpu",
                "platform.cpus_per_trial=0.1",
                f"seed={i}",
            ]
            spec, settings = to_specs(compose("config", overrides=overrides), overrides)
            jobs.append(TrialJob(i, overrides, spec, settings))
    gpu_seconds = float((sizes * seconds).sum())
    bound = max(gpu_seconds / a.gpus, float(seconds.max()))
    ray.init(
        num_cpus=max(4, a.gpus), num_gpus=a.gpus, include_dashboard=False, logging_level="ERROR", log_to_driver=False
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.time()
            results = []
            for job, result in run_jobs(jobs, lambda j: f"{tmp}/{j.index}", None):
                results.append((job, result, time.time()))
            makespan = time.time() - t0
    finally:
        ray.shutdown()
    ok = sum(r.status == "FINISHED" for _, r, _ in results)
    inside = [r.ended_at - r.started_at - j.spec.engine.seconds for j, r, _ in results]
    to_driver = [seen - r.ended_at for _, r, seen in results]
    print(
        f"{a.trials} sleep trials ({(sizes == 1).sum()} x 1 GPU, {(sizes == 2).sum()} x 2, {(sizes == 4).sum()} x 4), "
        f"{a.min_s:g}-{a.max_s:g} s each, on {a.gpus} fake GPUs; {ok} FINISHED"
    )
    rows = [
        ("GPU-seconds of work", f"{gpu_seconds:.1f}"),
        ("lower bound (s)", f"{bound:.1f}"),
        ("makespan (s)", f"{makespan:.1f}"),
        ("makespan / bound", f"{makespan / bound:.3f}  (target <= 1.15)"),
        ("in-worker overhead p50 / max (s)", f"{np.median(inside):.3f} / {max(inside):.3f}"),
        ("result reaches driver p50 / max (s)", f"{np.median(to_driver):.3f} / {max(to_driver):.3f}"),
        ("GPU utilisation", f"{gpu_seconds / (makespan * a.gpus):.1%}"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")


if __name__ == "__main__":
    main()
