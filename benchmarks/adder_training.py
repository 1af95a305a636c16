"""Does the tiny adder learn, and how long does it take? ``model=tiny_adder``'s training
(orchestrator/models/tiny.py::build_trained_model) run from scratch once per seed, into a
temporary folder (the model cache is not touched); one line per seed.

    python -m benchmarks.adder_training [--seeds 0 1 2 3] [override ...]
    python -m benchmarks.adder_training --seeds 0 model.tiny.train.extra_rounds=0   # the schedule alone

When the model learns depends on the floating-point rounding of the machine it trains on (the
same seed and code reached 0.95 held-out on one of our machines and 0.77 on another with the
recipe before 2026-12-03), so several seeds stand in for several machines. Per seed: the steps
it took (the schedule's, plus the extra rounds it needed to get ``min_accuracy`` of the 200
validation problems right), its validation and held-out accuracy (the 100 problems of
``eval=addition``, greedy) and the seconds. Run it alone: it uses ``train.threads`` cores.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from omegaconf import OmegaConf

from orchestrator.config.schema import TinyModelSpec
from orchestrator.models.tiny import build_trained_model
from testkit.compose import compose_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the model group, e.g. model.tiny.train.steps=3000")
    args = ap.parse_args()
    tiny = OmegaConf.to_container(compose_config(["model=tiny_adder", *args.overrides]).model.tiny)
    assert isinstance(tiny, dict)
    print(f"recipe: {tiny['train']}", flush=True)
    print("| seed | steps | validation | held-out | seconds |\n|---|---|---|---|---|", flush=True)
    for seed in args.seeds:
        spec = TinyModelSpec(**{**tiny, "seed": seed})
        with tempfile.TemporaryDirectory(prefix="adder-") as out:
            r = build_trained_model(spec, Path(out), log=lambda _: None)
        print(
            f"| {seed} | {r['steps']:.0f} | {r['validation_accuracy']:.3f} | {r['heldout_accuracy']:.2f} "
            f"| {r['train_s']:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
