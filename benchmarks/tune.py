"""The tuner against the full grid and Optuna's TPE, on real vLLM CPU servers, per scenario.

    python -m benchmarks.tune                              # every scenario, TPE with seed 0
    python -m benchmarks.tune --scenarios batch_slots --tpe-seeds 0 1 2
    python -m benchmarks.tune --workdir /tmp/tune-bench    # keeps the grids: a rerun reads them back
    python -m benchmarks.tune --methods tuner              # the tuner's path alone (no grid to compare with)

Each scenario is a baseline known to be badly configured, a small space whose first limiter is
a different cause, and an objective. For each:

* the grid runs every configuration of the space once, raced by the objective's race where the
  top ones are close (the product's own sweep); its verdict is the best configuration;
* the tuner (``hydra/sweeper=tune``) starts from the baseline;
* TPE (``hydra/sweeper=optuna``) gets as many measured runs as the tuner, per seed (a
  configuration the engine refuses, SKIPPED before a server starts, or one asked twice, read
  back, does not count).

Trial runs count a race's repeats; configurations are the distinct ones a method measured. A
method reaches the grid's best when its best configuration is the grid's, or is tied with it
within the objective's margin by the grid's own numbers. Runs to reach it: the grid's all (it
knows its best at its end); the tuner's through the step that adopted it (the baseline's first
run when the baseline is it); TPE's through the trial after which its pick, its best single
run so far, was it and stayed so. Prints a table (docs/tuning.md keeps it with its date and machine)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.scheduling import outcome

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Scenario:
    name: str
    cause: str  # the baseline's first limiter, as the scenario is built
    fixed: list[str]  # the experiment and what the grid and the tuner share
    space: dict[str, list[str]]  # knob -> values, the baseline's first
    key: str  # the objective's metric
    maximize: bool
    at: str | None = None


SCENARIOS = {
    "batch_slots": Scenario(
        "batch_slots",
        "batch slots",
        ["+experiment=continuous_batching", "+objective.max_repeats=3"],
        # 32 requests arrive at once: the demand is 32; the token budget is a knob the user allows
        # that no finding at this point names (16-token prompts: 64 tokens a step still admit some)
        {"engine.max_num_seqs": ["1", "2", "4", "8", "16", "32"], "engine.max_num_batched_tokens": ["2048", "64"]},
        "tokens_per_second",
        True,
    ),
    "prefill_interference": Scenario(
        "prefill_interference",
        "prefill interference",
        [
            "+experiment=chunked_prefill",
            "hydra.sweeper.params.variant=chunking_off",  # one variant: the space below is the grid
            "per_platform.cpu.workload.load_points=[{concurrency:4}]",
            "~objective",
            # the stall a typical short stream saw: ITL p99 at this size sits at the edge of the
            # stalls' share of ITLs and flipped between 151 and 500 ms over runs of one config
            "+objective={minimize:short/itl_worst_ms_p50,at:c4,subject_to:{long/ttft_ms_p99:3000},max_repeats:3}",
        ],
        {
            "engine.enable_chunked_prefill": ["false", "true"],
            "engine.max_num_batched_tokens": ["2048", "1024", "768", "512", "384", "256", "192", "128"],
        },
        "short/itl_worst_ms_p50",
        False,
        "c4",
    ),
    "prefix_reuse": Scenario(
        "prefix_reuse",
        "prefix reuse missed",
        [
            "+experiment=prefix_caching",
            "hydra.sweeper.params.variant=apc_off_prefix_1024",  # 1024 shared tokens of 1088, 4 groups
            # 2 requests a second: one batch slot queues them, cached or not; the baseline's 4 do not
            "per_platform.cpu.workload.load_points=[{rate:2,arrival:constant}]",
            "per_platform.cpu.workload.num_requests=16",
            "~objective",
            "+objective={minimize:ttft_ms_p50,max_repeats:3}",
        ],
        # the knobs a user would allow, each with values that cost TTFT here (one slot queues, a
        # 64- or 128-token budget splits even a cached prompt's step): with its cache off, every
        # configuration recomputes the shared 1024 tokens, so the best is a small share of the space
        {
            "engine.enable_prefix_caching": ["false", "true"],
            "engine.max_num_seqs": ["4", "1", "2", "8"],
            "engine.max_num_batched_tokens": ["2048", "64", "128"],
        },
        "ttft_ms_p50",
        False,
    ),
}


def run(argv: list[str]) -> tuple[float, str]:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "orchestrator", *argv], cwd=ROOT, capture_output=True, text=True)
    if p.returncode not in (outcome.OK, outcome.UNDECIDED):
        raise RuntimeError(p.stdout[-3000:] + p.stderr[-3000:])
    return time.monotonic() - t0, p.stdout


def experiment_of(s: Scenario) -> str:
    return s.fixed[0].split("=", 1)[1]


def measured(store: str, s: Scenario, first: bool = False) -> tuple[dict[str, float], int, list[tuple[str, float]]]:
    """Each configuration's value of the objective (mean over its runs; knobs as a key), the
    trial runs measured, and each configuration's first run's value in the order they ran, from
    the store (``first``: its first sweep, the one that measured them; a rerun reads them back
    and logs only what it skips)."""
    from mlflow.tracking import MlflowClient

    from orchestrator.config.schema import ObjectiveSpec
    from orchestrator.decide.objective import value_of
    from orchestrator.decide.trials import TrialData
    from orchestrator.tracking.runs import from_mlflow

    client = MlflowClient(tracking_uri=store)
    exp = client.get_experiment_by_name(experiment_of(s))
    assert exp is not None, store
    sweeps = client.search_runs([exp.experiment_id], "tags.run_kind = 'sweep'", order_by=["attributes.start_time ASC"])
    finished: dict[str, TrialData] = {}  # every sweep's (TPE's reruns are sweeps of their own), by trial hash
    for sweep in sweeps[:1] if first else sweeps:
        for t in from_mlflow(store, experiment_of(s), sweep.info.run_id).finished:
            finished.setdefault(t.trial_hash, t)
    goal = ObjectiveSpec.model_validate({("maximize" if s.maximize else "minimize"): s.key, "at": s.at})
    values: dict[str, float] = {}
    order: list[tuple[str, float]] = []
    runs = 0
    for t in finished.values():  # in the order they started
        runs += 1 + len(t.runs)
        v = value_of(t, goal.key, goal.at)
        if v is not None:
            values[config_key(t.params, s)] = v.value
            once = value_of(dataclasses.replace(t, runs=[]), goal.key, goal.at)  # what one run told
            order.append((config_key(t.params, s), once.value if once is not None else v.value))
    return values, runs, order


def config_key(params: dict[str, Any], s: Scenario) -> str:
    return ",".join(f"{k.removeprefix('engine.')}={str(params.get(k)).lower()}" for k in s.space)


MARGIN = 0.1  # a tie with the grid's best: within this share of it, by the grid's own numbers


def gap(key: str, grid: dict[str, float], grid_best: str, s: Scenario) -> float | None:
    """How much worse than the grid's best ``key`` came out in the grid (None: not measured there)."""
    v, b = grid.get(key), grid[grid_best]
    if v is None:
        return None
    return (b - v) / b if s.maximize else (v - b) / b


def reached(best: str | None, grid: dict[str, float], grid_best: str, s: Scenario) -> str:
    if best is None:
        return "no best"
    if best == grid_best:
        return "yes (the grid's best)"
    off = gap(best, grid, grid_best, s)
    if off is None:
        return f"no ({best}: not measured by the grid)"
    return f"yes (a tie: {off:+.0%} of the grid's best)" if off <= MARGIN else f"no ({best}: {off:+.0%} off)"


def in_tier(key: str | None, grid: dict[str, float], grid_best: str, s: Scenario) -> bool:
    off = gap(key, grid, grid_best, s) if key is not None else None
    return off is not None and off <= MARGIN


def tuner_reach(path: dict[str, Any], grid: dict[str, float], grid_best: str, s: Scenario) -> int | None:
    """The trial runs after which the tuner's incumbent was the grid's best or tied with it: the
    baseline's first run, or the step that adopted it (its race's runs included)."""
    base = {k: v[0] for k, v in s.space.items()}
    if in_tier(config_key(base, s), grid, grid_best, s):
        return 1
    for step in path["steps"]:
        knobs = {k: str(v).lower() for k, v in (step.get("adopted_knobs") or {}).items()}
        if knobs and in_tier(config_key({**base, **knobs}, s), grid, grid_best, s):
            return int(step.get("trials") or path["trials"])
    return None


def tpe_reach(order: list[tuple[str, float]], grid: dict[str, float], grid_best: str, s: Scenario) -> int | None:
    """The trials after which TPE's pick (its best single run so far) was the grid's best or tied
    with it, and stayed so to the end of its budget."""
    picks: list[str] = []
    best: tuple[str, float] | None = None
    for key, value in order:  # the pick after each trial: the best single run so far
        if best is None or (value > best[1] if s.maximize else value < best[1]):
            best = (key, value)
        picks.append(best[0])
    reach = None
    for i in range(len(picks), 0, -1):
        if not in_tier(picks[i - 1], grid, grid_best, s):
            break
        reach = i
    return reach


Row = tuple[str, int, int | None, int, float, str, str]
METHODS = ["grid", "tuner", "tpe"]


def scenario_rows(s: Scenario, tmp: str, tpe_seeds: list[int], methods: list[str] = METHODS) -> list[Row]:
    """(method, trial runs, the runs to reach the grid's best, configurations measured, wall s,
    its best, whether it reached the grid's best); ``methods``: which of the grid, the tuner and
    TPE run (without the grid, nothing is compared with its best)."""
    lists = [f"{k}={','.join(v)}" for k, v in s.space.items()]
    rows: list[Row] = []
    for old in Path(tmp).glob(f"{s.name}-*"):  # the tuner's and TPE's runs start afresh; the grid's are kept
        if "-grid" not in old.name:
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    if "grid" not in methods:
        if "tuner" in methods:
            rows.append(tuner_row(s, tmp, lists, None))
        return rows
    grid, grid_best, grid_row = grid_measured(s, tmp, lists)
    rows.append(grid_row)
    tuner = tuner_row(s, tmp, lists, (grid, grid_best)) if "tuner" in methods else None
    if tuner is not None:
        rows.append(tuner)
    budget = tuner[1] if tuner is not None else len(grid)
    if "tpe" in methods:
        rows += [tpe_row(s, tmp, lists, seed, budget, grid, grid_best) for seed in tpe_seeds]
    return rows


def grid_measured(s: Scenario, tmp: str, lists: list[str]) -> tuple[dict[str, float], str, Row]:
    """The grid's values (its first run: a rerun reads them back), its best and its row."""
    store = f"sqlite:///{tmp}/{s.name}-grid.db"
    timed = Path(tmp) / f"{s.name}-grid-wall_s.txt"  # the grid's first run: a rerun only reads it back
    wall, _ = run([*s.fixed, *lists, f"tracking.uri={store}", f"hydra.sweep.dir={tmp}/{s.name}-grid", "-m"])
    if timed.exists():
        wall = float(timed.read_text())
    else:
        timed.write_text(f"{wall:.1f}")
    grid, runs, _ = measured(store, s, first=True)
    grid_best = (max if s.maximize else min)(grid, key=lambda k: grid[k])
    return grid, grid_best, ("grid", runs, runs, len(grid), wall, grid_best, "-")  # it knows its best at its end


def tuner_row(s: Scenario, tmp: str, lists: list[str], against: tuple[dict[str, float], str] | None) -> Row:
    """The tuner from the baseline; its path printed as it said it (``against``: the grid's values
    and best, for the runs to reach it)."""
    store = f"sqlite:///{tmp}/{s.name}-tune.db"
    sweep = f"{tmp}/{s.name}-tune"
    wall, out = run([*s.fixed, *lists, "hydra/sweeper=tune", f"tracking.uri={store}", f"hydra.sweep.dir={sweep}", "-m"])
    path = json.loads((Path(sweep) / "report" / "tuning.json").read_text())
    knobs = {**{k: v[0] for k, v in s.space.items()}, **{k: str(v).lower() for k, v in path["best"]["knobs"].items()}}
    tuned = config_key(knobs, s)
    configs = len(measured(store, s)[0])
    print("\n".join(line for line in out.splitlines() if line.startswith("tune: step") and "passed over" not in line))
    if against is None:
        return ("tuner", path["trials"], None, configs, wall, tuned, "-")
    grid, grid_best = against
    reach = tuner_reach(path, grid, grid_best, s)
    return ("tuner", path["trials"], reach, configs, wall, tuned, reached(tuned, grid, grid_best, s))


def tpe_row(
    s: Scenario, tmp: str, lists: list[str], seed: int, budget: int, grid: dict[str, float], grid_best: str
) -> Row:
    """TPE with ``seed``, given ``budget`` measured runs (the tuner's)."""
    store = f"sqlite:///{tmp}/{s.name}-tpe{seed}.db"
    # as many measured runs as the tuner's: a configuration the engine refuses (SKIPPED before
    # any server starts) or one asked again (read back) costs TPE nothing, so it asks on
    asks, wall, rerun = budget, 0.0, 0
    while True:
        took, out = run(
            [
                *s.fixed,
                *lists,
                "hydra/sweeper=optuna",
                f"hydra.sweeper.n_trials={asks}",  # the study's total: a rerun resumes it
                # a resumed study's sampler starts from its seed again: a rerun with the same seed
                # would draw the same configurations (refused ones included) again
                f"hydra.sweeper.seed={seed + 1000 * rerun}",
                f"hydra.sweeper.storage=sqlite:///{tmp}/{s.name}-optuna{seed}.db",
                f"tracking.uri={store}",
                f"hydra.sweep.dir={tmp}/{s.name}-tpe{seed}",
                "-m",
            ]
        )
        wall += took
        found, runs, order = measured(store, s)
        if runs >= budget or asks >= 5 * budget:
            break
        asks += budget - runs
        rerun += 1
    best = (max if s.maximize else min)(found, key=lambda k: found[k]) if found else None
    reach = tpe_reach(order, grid, grid_best, s)
    return (f"TPE seed {seed}", runs, reach, len(found), wall, best or "-", reached(best, grid, grid_best, s))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", nargs="*", default=list(SCENARIOS), choices=list(SCENARIOS))
    ap.add_argument("--tpe-seeds", nargs="*", type=int, default=[0])
    ap.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS)
    ap.add_argument("--workdir", help="keep the stores here: a grid already measured is read back, not run again")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = a.workdir or scratch
        Path(tmp).mkdir(parents=True, exist_ok=True)
        for name in a.scenarios:
            s = SCENARIOS[name]
            rows = scenario_rows(s, tmp, a.tpe_seeds, a.methods)
            size = 1
            for v in s.space.values():
                size *= len(v)
            print(
                f"\n{s.name}: baseline {', '.join(f'{k}={v[0]}' for k, v in s.space.items())} (first limiter: "
                f"{s.cause}); space of {size} configurations; {'maximize' if s.maximize else 'minimize'} {s.key}"
            )
            print(
                "| method | trial runs | runs to reach the grid's best | configurations | wall s | best configuration "
                "| reached the grid's best |\n|---|---|---|---|---|---|---|"
            )
            for method, n, reach, configs, wall, best, ok in rows:
                print(f"| {method} | {n} | {reach or '-'} | {configs} | {wall:.0f} | {best} | {ok} |", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
