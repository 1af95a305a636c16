"""The tuner (``hydra/sweeper=tune``): from a baseline configuration, act on its own diagnosis.

Each step diagnoses the incumbent at the objective's point and proposes the levers of its
limiter, then of its other findings (:class:`orchestrator.tuning.planner.Planner`), and races
them beside the incumbent in one launch with the step's own requests (``seed``; step 1 shares
the baseline's, so the run that diagnosed it is read back as its first). The leader is adopted
only when it beats the incumbent with the race's confidence
(:func:`orchestrator.tuning.judging.judge_race`). A configuration raced before is passed over,
except for a second look: its race was undecided with it in the lead and a later diagnosis of the
same incumbent names it again; that race is then continued alone, with its own requests (its runs
read back) and ``objective.max_repeats`` raised to the runs its noise asks for. The tuning stops
when no lever is left, at ``max_steps``, or before passing ``max_trials`` or ``max_wall_s``;
several adoptions end with the best raced against the baseline. Every trial is an ordinary trial
(Ray, results on disk before MLflow), so the same command run again measures nothing twice and
takes the same decisions (docs/tuning.md)."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.config.errors import ConfigError
from orchestrator.decide.objective import point_at
from orchestrator.decide.trials import TrialData
from orchestrator.scheduling.compose import SweepComposer
from orchestrator.scheduling.launched import Launcher, launch_batch
from orchestrator.scheduling.ray_exec import ray_kept_between_sweeps
from orchestrator.scheduling.search import objective_of, search_space
from orchestrator.tuning.candidates import (
    BASELINE,
    Candidate,
    continued_race,
    key_of,
    knob_words,
    name_of,
    parsed,
    tunable,
)
from orchestrator.tuning.configs import ComposedConfigs
from orchestrator.tuning.judging import change_words, gain, judge_race
from orchestrator.tuning.levers import load_levers
from orchestrator.tuning.moves import propose
from orchestrator.tuning.options import TuneOptions
from orchestrator.tuning.path import Step, path_lines, undecided_hint
from orchestrator.tuning.planner import Planner, Policy
from orchestrator.tuning.record import Raced, TuningRecord
from orchestrator.tuning.space import Space, check_space, space_words

if TYPE_CHECKING:
    from hydra.types import HydraContext
    from omegaconf import DictConfig


class TrialBudget:
    """The tuning's trial runs so far (a run read back counts once) against ``max_trials``, and
    its time against ``max_wall_s``."""

    def __init__(self, max_trials: int, max_wall_s: float | None) -> None:
        self.max_trials, self.max_wall_s = max_trials, max_wall_s
        self.started = time.monotonic()
        self.runs = 0
        self._counted: set[str] = set()  # the runs counted, by trial hash

    def count(self, trial: TrialData) -> None:
        """A configuration's runs as a launch returned them: each new one counts."""
        for run in [trial, *trial.runs]:
            if not run.trial_hash or run.trial_hash not in self._counted:
                self.runs += 1
                self._counted.add(run.trial_hash)

    def over(self, trials: int) -> str:
        if self.runs + trials > self.max_trials:
            return f"max_trials {self.max_trials}: {self.runs} run, the step needs {trials} or more"
        spent = time.monotonic() - self.started
        if self.max_wall_s is not None and spent >= self.max_wall_s:
            return f"max_wall_s {self.max_wall_s:g}: {spent:.0f} s spent"
        return ""


class Tuner:
    """One tuning session: the launcher, the configurations, the planner, the path so far."""

    def __init__(
        self,
        hydra_context: HydraContext,
        config: DictConfig,
        launcher: Launcher,
        arguments: list[str],
        options: TuneOptions,
    ):
        self.launcher, self.options = launcher, options
        fixed, lists = search_space(hydra_context, {}, arguments, sweeper="tune")
        seed = next((o.split("=", 1)[1] for o in fixed if key_of(o) == "seed"), config.get("seed") or 0)
        # a command line's list (engine.max_num_seqs=1,2,4,8) is the knob's space, its first value the baseline's
        fixed = [o for o in fixed if key_of(o) != "seed"] + [f"{k}={vs[0]}" for k, vs in lists.items()]
        self.configs = ComposedConfigs(SweepComposer(hydra_context.config_loader, config), fixed, int(seed))
        self.objective = tunable(objective_of(config, sweeper="tune"))
        levers = load_levers(options.levers)
        space = Space.of(options.space, {k: [parsed(v) for v in vs] for k, vs in lists.items()})
        check_space(space, levers)
        self.dry = bool(config.get("dry_run"))
        self.json_plan = str(config.get("dry_run")) == "json"
        self.sweep_dir = Path(str(config.hydra.sweep.dir)).expanduser().absolute()
        self.steps: list[Step] = []
        self.job_idx = 0
        self.budget = TrialBudget(options.max_trials, options.max_wall_s)
        base = self.configs.job_of({})  # the baseline validated before anything starts
        self.base_spec = base.spec
        policy = Policy(
            levers,
            space,
            base.spec.engine.name,
            "gpu" if base.spec.platform.device == "cuda" else "cpu",  # the lever table's words
            self.objective.guards_accuracy,
            max(1, options.candidates),
            options.combine,
        )
        self.planner = Planner(policy, self.configs, self.budget)
        tracking = base.settings.tracking
        uri = tracking.uri if tracking.enabled and not self.dry else None
        self.record = TuningRecord(self.sweep_dir, uri, tracking.experiment_name or str(config.experiment))

    # -- the loop ---------------------------------------------------------------------

    def run(self) -> list[Any]:
        o = self.options
        self.say(
            f"tune: baseline {' '.join(self.configs.fixed) or '(the experiment as it is)'}; objective "
            f"{'maximize' if self.objective.maximize else 'minimize'} {self.objective.key}"
            + (f" at {self.objective.at}" if self.objective.at else "")
            + f"; space: {space_words(self.planner.policy.space)}; at most {o.max_steps} steps, {o.max_trials} trials"
        )
        if self.dry:
            return self.plan()
        returns: list[Any] = []
        with ray_kept_between_sweeps():
            incumbent = Candidate(BASELINE, {})
            trial = self.launch([incumbent], 0, returns).get(BASELINE)
            if trial is None or trial.status != "FINISHED":
                why = trial.error if trial is not None else "it did not run"
                raise ConfigError(f"tune: the baseline did not finish ({why}); nothing to tune from")
            for k in range(1, o.max_steps + 1):
                ran = self.step(k, incumbent, trial, returns)
                if ran is None:
                    break
                incumbent, trial = ran
            self.finish(incumbent, returns)
        return returns

    def step(
        self, k: int, incumbent: Candidate, trial: TrialData, returns: list[Any]
    ) -> tuple[Candidate, TrialData] | None:
        """Step ``k`` from the incumbent's trial: the incumbent after it and its trial, or None
        where the tuning stops (no lever left, the budget)."""
        step, candidates = self.planner.next_step(k, incumbent, point_at(trial, self.objective.at))
        self.steps.append(step)
        step.trials = self.budget.runs  # a step not run adds none
        if not candidates:
            step.decision = "no lever left to try" + undecided_hint(step)
            self.say(f"tune: step {k}: {incumbent.name} {step.headline}; {step.decision}: stopping")
            self.passed_over(step)
            return None
        again = continued_race(candidates)  # a second look: its first race, continued
        stop = self.budget.over(2 * again.more() if again else len(candidates) + 1)
        if stop:
            step.decision = f"not run: {stop}"
            self.say(f"tune: step {k}: stopping before it ({stop})")
            return None
        self.say(
            f"tune: step {k}: {incumbent.name} {step.headline} -> trying "
            + "; ".join(f"{c.proposal.lever.name} ({c.name})" for c in candidates if c.proposal)
        )
        self.passed_over(step)
        named = self.launch([incumbent, *candidates], k, returns, *(again.continued() if again else ()))
        step.trials = self.budget.runs
        adopted = self.judge(step, incumbent, candidates, named)
        if adopted is not None:
            incumbent = adopted
        return incumbent, named.get(incumbent.name) or trial

    def passed_over(self, step: Step) -> None:
        """The levers the step passed over and why, and what its diagnosis could not judge."""
        for skipped in step.passed_over:
            self.say(f"tune: step {step.index}:   passed over {skipped.lever} ({skipped.cause}): {skipped.why}")
        if step.unjudged:
            self.say(f"tune: step {step.index}:   the diagnosis could not judge: {'; '.join(step.unjudged)}")

    def launch(
        self,
        candidates: Sequence[Candidate],
        step: int,
        returns: list[Any],
        requests_of: int | None = None,
        extra: Sequence[str] = (),
    ) -> dict[str, TrialData]:
        """Run the step's configurations as one raced launch (``requests_of``: with that step's
        requests, a second look; ``extra``: overrides for the race); each one's trial data by name."""
        lines = [
            self.configs.overrides(c.knobs, step if requests_of is None else requests_of, extra) for c in candidates
        ]
        batch = launch_batch(self.launcher, lines, self.job_idx)
        self.job_idx += len(lines)
        returns.append(batch.returns)
        named: dict[str, TrialData] = {}
        for c, outcome in zip(candidates, batch.outcomes):
            trial = outcome.trial or TrialData(c.name, outcome.status, {}, {}, [], error=outcome.why)
            named[c.name] = dataclasses.replace(trial, name=c.name)
            self.budget.count(trial)
        return named

    def judge(
        self, step: Step, incumbent: Candidate, candidates: list[Candidate], named: dict[str, TrialData]
    ) -> Candidate | None:
        """The step's race: adopt a candidate that beats the incumbent, or keep it (a second look:
        on its first race's runs and the runs that continued it)."""
        judged = judge_race(named, incumbent.name, self.objective)
        step.values, step.decision = judged.values, judged.decision
        outcome = judged.outcome
        adopted = next((c for c in candidates if c.name == outcome.adopted), None)
        if adopted is not None and outcome.comparison is not None:
            step.adopted, step.adopted_knobs = adopted.name, dict(adopted.knobs)
            step.gain = gain(outcome.comparison)
            step.log_scale = outcome.comparison.log_scale
        self.say(f"tune: step {step.index}: {step.decision}")
        raced = [Raced(c.name, c is incumbent, c.proposal, named.get(c.name)) for c in [incumbent, *candidates]]
        self.record.tag_step(step, raced)
        self.planner.remember(step, incumbent, candidates, judged)
        return adopted

    def finish(self, best: Candidate, returns: list[Any]) -> None:
        """The best against the baseline (raced again when the path took several steps), the path
        in words, the files and the MLflow tags."""
        lines = path_lines(self.steps)
        adopted = [s for s in self.steps if s.adopted]
        against = "the baseline is the best configuration found"
        if len(adopted) == 1:
            against = f"{best.name} against the baseline: {self.objective.key} {_gain_words(adopted[0])}"
        elif adopted:
            stop = self.budget.over(2)
            if stop:
                against = f"{best.name} against the baseline: not raced ({stop})"
            else:
                self.say(f"tune: racing {best.name} against the baseline")
                k = len(self.steps) + 1
                named = self.launch([Candidate(BASELINE, {}), best], k, returns)
                final = Step(k, BASELINE, "", [], trials=self.budget.runs)
                self.judge(final, Candidate(BASELINE, {}), [best], named)
                against = f"{best.name} against the baseline: {self.objective.key} " + (
                    _gain_words(final) if final.adopted else final.decision
                )
        best_words = f"Best: {best.name}" + (f" ({knob_words(best.knobs)})" if best.name != name_of(best.knobs) else "")
        summary = [*lines, f"{best_words}; {against}. {self.budget.runs} trials."]
        for line in summary:
            self.say(f"tune: {line}")
        self.record.write(self.objective, self.steps, best, self.budget.runs, summary)

    def plan(self) -> list[Any]:
        """A dry run: the baseline's plan, and the levers it would consider first (every cause's,
        in the table's order, since nothing is diagnosed yet)."""
        returns = [launch_batch(self.launcher, [self.configs.overrides({}, 0)], 0).returns]
        p = self.planner.policy
        start = p.start(self.configs.knobs({}))
        self.say("tune: dry run: nothing measured. The levers it would consider, by what the diagnosis names:")
        for cause, levers in p.levers.items():
            for lever in levers:
                proposal = propose(cause, lever, start)
                why = proposal.skip or self.configs.refused({**proposal.values})
                self.say(
                    f"tune:   {cause}: {lever.name}: "
                    + (f"passed over ({why})" if why else proposal.words(start.knobs))
                )
        return returns

    def say(self, line: str) -> None:
        """A progress line: on stdout, or on stderr under ``dry_run=json`` (stdout is the plan's JSON)."""
        print(line, file=sys.stderr if self.json_plan else sys.stdout, flush=True)


def run_tuning(
    hydra_context: HydraContext, config: DictConfig, launcher: Launcher, arguments: list[str], options: TuneOptions
) -> Any:
    """The body of ``hydra/sweeper=tune``."""
    return Tuner(hydra_context, config, launcher, arguments, options).run()


def _gain_words(step: Step) -> str:
    return change_words(*step.gain, step.log_scale) if step.gain is not None else "no gain measured"
