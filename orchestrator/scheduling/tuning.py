"""The tuner (``hydra/sweeper=tune``): from a baseline configuration, act on its own diagnosis.

Each step diagnoses the incumbent at the objective's point, proposes the levers of its limiter
then of its other findings (:mod:`orchestrator.decide.levers`; two causes' moves on different
knobs also together), checks each candidate as a sweep would, and races them beside the
incumbent in one launch with the step's own requests (``seed``; step 1 shares the baseline's, so
the run that diagnosed it is read back as its first). The leader is adopted only when it beats
the incumbent with the race's confidence (:func:`orchestrator.decide.tune.judge_step`). A
configuration raced before is passed over, except for a second look: its race was undecided with
it in the lead and a later diagnosis of the same incumbent names it again; that race is then
continued alone, with its own requests (its runs read back) and ``objective.max_repeats`` raised
to the runs its noise asks for. The tuning stops when no lever is left, at ``max_steps``, or
before passing ``max_trials`` or ``max_wall_s``; several adoptions end with the best raced
against the baseline. Every trial is an ordinary trial (Ray, results on disk before MLflow), so
the same command run again measures nothing twice and takes the same decisions (docs/tuning.md)."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.config.errors import ConfigError
from orchestrator.decide.levers import MODEL_KNOB, Proposal, Space, combined, load_levers, propose
from orchestrator.decide.objective import point_at, value_of
from orchestrator.decide.race import UNDECIDED
from orchestrator.decide.trials import TrialData
from orchestrator.decide.tune import (
    Step,
    causes_of,
    change_words,
    gain,
    judge_step,
    path_lines,
    undecided_hint,
)
from orchestrator.decide.verdict import decide, race_over
from orchestrator.feasibility import assess
from orchestrator.scheduling.compose import SweepComposer
from orchestrator.scheduling.jobs import TrialJob, prepare_jobs
from orchestrator.scheduling.ray_exec import ray_kept_between_sweeps
from orchestrator.scheduling.search import objective_of, search_space
from orchestrator.scheduling.tuning_knobs import (
    BASELINE,
    Candidate,
    Tried,
    check_space,
    continued_race,
    hydra_value,
    identity,
    key_of,
    knob_words,
    name_of,
    parsed,
    space_words,
    tunable,
)
from orchestrator.scheduling.tuning_record import Raced, TuningRecord

log = logging.getLogger(__name__)

SEED_STEP = 1000  # step k's requests: seed + (k - 1) * SEED_STEP (fresh for the step, the same for its trials)


class Tuner:
    """One tuning session: the launcher, the options, the path so far."""

    def __init__(self, hydra_context: Any, config: Any, launcher: Any, arguments: list[str], options: dict[str, Any]):
        self.launcher = launcher
        self.config = config
        fixed, lists = search_space(hydra_context, {}, arguments, sweeper="tune")
        self.base_seed = int(config.get("seed") or 0)
        self.fixed = [o for o in fixed if key_of(o) != "seed"]
        for o in fixed:
            if key_of(o) == "seed":
                self.base_seed = int(o.split("=", 1)[1])
        self.objective = tunable(objective_of(config, sweeper="tune"))
        self.levers = load_levers(options.get("levers"))
        # a command line's list (engine.max_num_seqs=1,2,4,8) is the knob's space, its first value the baseline's
        self.fixed += [f"{k}={vs[0]}" for k, vs in lists.items()]
        self.space = Space.of(options.get("space"), {k: [parsed(v) for v in vs] for k, vs in lists.items()})
        check_space(self.space, self.levers)
        self.max_steps = int(options.get("max_steps", 6))
        self.max_trials = int(options.get("max_trials", 40))
        self.max_wall_s = float(options.get("max_wall_s") or 0) or None
        self.per_step = max(1, int(options.get("candidates", 2)))
        self.combine = bool(options.get("combine", True))  # two causes' moves also raced together
        self.composer = SweepComposer(hydra_context.config_loader, config)
        self.dry = bool(config.get("dry_run"))
        self.json_plan = str(config.get("dry_run")) == "json"
        self.sweep_dir = Path(str(config.hydra.sweep.dir)).expanduser().absolute()
        self.steps: list[Step] = []
        self.trials_run = 0
        self.counted: set[str] = set()  # the runs counted in trials_run, by hash (a run read back counts once)
        self.job_idx = 0
        self.started = time.monotonic()
        self.base_job = self.job_of({})  # the baseline validated before anything starts
        settings = self.base_job.settings
        uri = settings.tracking.uri if settings.tracking.enabled and not self.dry else None
        self.record = TuningRecord(self.sweep_dir, uri, settings.tracking.experiment_name or str(config.experiment))
        self.seen: dict[str, str] = {}  # the knobs of every configuration run (json) -> its name
        self.tried: dict[str, Tried] = {}  # the identity of every configuration raced -> its race

    # -- configurations ---------------------------------------------------------------

    def overrides(self, knobs: Mapping[str, Any], step: int, extra: Sequence[str] = ()) -> list[str]:
        kept = [o for o in self.fixed if key_of(o) not in knobs]
        return [
            *kept,
            *(f"++{k}={hydra_value(v)}" for k, v in knobs.items()),
            f"seed={self.base_seed + max(step - 1, 0) * SEED_STEP}",  # step 0 (the baseline) and 1 share
            *extra,
        ]

    def job_of(self, knobs: Mapping[str, Any]) -> TrialJob:
        """The configuration as a validated job (a :class:`ConfigError` says why not)."""
        lines = self.overrides(knobs, 0)
        data, _ = self.composer.compose(lines, 0)
        return prepare_jobs([(lines, data)], whole_sweep=False)[0]

    def engine_knobs(self, job: TrialJob) -> dict[str, Any]:
        """The configuration's knobs as the levers read them: every engine knob, and the model's name."""
        knobs: dict[str, Any] = {f"engine.{k}": v for k, v in job.spec.engine.model_dump(mode="json").items()}
        return {**knobs, MODEL_KNOB: job.spec.model.name}  # what a lever's models read

    # -- the loop ---------------------------------------------------------------------

    def run(self) -> list[Any]:
        base_job = self.base_job
        engine = base_job.spec.engine.name
        platform = "gpu" if base_job.spec.platform.device == "cuda" else "cpu"  # the lever table's words
        self.say(
            f"tune: baseline {' '.join(self.fixed) or '(the experiment as it is)'}; objective "
            f"{'maximize' if self.objective.maximize else 'minimize'} {self.objective.key}"
            + (f" at {self.objective.at}" if self.objective.at else "")
            + f"; space: {space_words(self.space)}; at most {self.max_steps} steps, {self.max_trials} trials"
        )
        if self.dry:
            return self.plan(base_job, engine, platform)
        returns: list[Any] = []
        with ray_kept_between_sweeps():
            first = self.launch([Candidate(BASELINE, {})], 0, returns)
            incumbent = Candidate(BASELINE, {})
            trial = first.get(BASELINE)
            if trial is None or trial.status != "FINISHED":
                why = trial.error if trial is not None else "it did not run"
                raise ConfigError(f"tune: the baseline did not finish ({why}); nothing to tune from")
            for k in range(1, self.max_steps + 1):
                step, candidates = self.next_step(k, incumbent, trial, engine, platform)
                self.steps.append(step)
                step.trials = self.trials_run  # a step not run adds none
                if not candidates:
                    step.decision = "no lever left to try" + undecided_hint(step)
                    self.say(f"tune: step {k}: {incumbent.name} {step.headline}; {step.decision}: stopping")
                    self.passed_over(step)
                    break
                again = continued_race(candidates)  # a second look: its first race, continued
                stop = self.over_budget(2 * again.more() if again else len(candidates) + 1)
                if stop:
                    step.decision = f"not run: {stop}"
                    self.say(f"tune: step {k}: stopping before it ({stop})")
                    break
                self.say(
                    f"tune: step {k}: {incumbent.name} {step.headline} -> trying "
                    + "; ".join(f"{c.proposal.lever.name} ({c.name})" for c in candidates if c.proposal)
                )
                self.passed_over(step)
                named = self.launch([incumbent, *candidates], k, returns, *(again.continued() if again else ()))
                step.trials = self.trials_run
                adopted = self.judge(step, incumbent, candidates, named)
                if adopted is not None:
                    incumbent = adopted
                if named.get(incumbent.name) is not None:
                    trial = named[incumbent.name]
            self.finish(incumbent, returns)
        return returns

    def next_step(
        self, k: int, incumbent: Candidate, trial: TrialData, engine: str, platform: str
    ) -> tuple[Step, list[Candidate]]:
        """The step's diagnosis of the incumbent and the candidates its levers propose."""
        point = point_at(trial, self.objective.at)
        causes = causes_of(point) if point is not None else []
        headline = point.diagnosis.get("headline", "not diagnosed") if point is not None else "measured no point"
        step = Step(k, incumbent.name, str(headline), [c.cause for c in causes])
        step.unjudged = [str(u) for u in (point.diagnosis.get("unmeasured") or [])] if point is not None else []
        current = self.engine_knobs(self.job_of(incumbent.knobs))
        chosen: list[Candidate] = []
        for cause in causes:
            for lever in self.levers.get(cause.cause, []):
                if len(chosen) >= self.per_step:
                    break
                p = propose(cause.cause, lever, current, self.space, engine, platform, self.objective, cause.evidence)
                taken = self.consider(step, incumbent, p, chosen, current)
                if taken is not None and taken.earlier is not None:
                    return step, chosen  # a second look: its race continued, alone in its step
        both = combined(*(c.proposal for c in chosen)) if self.combine and len(chosen) == 2 else None
        if both is not None:  # two causes' moves on different knobs: also both together
            self.consider(step, incumbent, both, chosen, current)
        return step, chosen

    def consider(
        self, step: Step, incumbent: Candidate, p: Proposal, chosen: list[Candidate], current: Mapping[str, Any]
    ) -> Candidate | None:
        """The proposal as one of the step's candidates, or passed over with its reason."""
        knobs = {**incumbent.knobs, **p.values}
        ident = identity(knobs)
        earlier = self.tried.get(ident)
        why = p.skip or self.passed(step, ident, earlier, chosen, incumbent) or self.refused(knobs)
        if not why and earlier is not None and chosen:  # a second look continues its race alone
            why = f"its race (step {earlier.step}) is continued in a step of its own, after this one"
        if why:
            step.passed_over.append({"cause": p.cause, "lever": p.lever.name, "why": why})
            return None
        taken = Candidate(self.seen.setdefault(ident, name_of(knobs)), knobs, p, earlier)
        chosen.append(taken)
        tried: dict[str, Any] = {
            "cause": p.cause,
            "lever": p.lever.name,
            "name": taken.name,
            "change": p.words(current),
        }
        if earlier is not None:  # that step's race, continued
            tried["change"] += (
                f" (a second look: step {earlier.step}'s race was undecided after {earlier.runs} runs each; "
                f"continued to {earlier.need}, the runs its noise asks for)"
            )
            tried["second_look_of"] = earlier.step
        step.tried.append(tried)
        return taken

    def passed(
        self, step: Step, ident: str, earlier: Tried | None, chosen: list[Candidate], incumbent: Candidate
    ) -> str:
        """Why a configuration a lever proposes is not raced as tried already, or '': new, or a
        second look (its race was undecided with it in the lead, beside the same incumbent)."""
        if any(identity(c.knobs) == ident for c in chosen):
            return "proposed already in this step"
        if earlier is None:
            return ""
        if earlier.second_look(identity(incumbent.knobs)):
            if earlier.need is None:
                return (
                    f"tried already ({earlier.words()}); at the noise measured no practical number of runs decides it"
                )
            if stop := self.over_budget(2 * earlier.more()):
                return f"tried already ({earlier.words()}); deciding needs {earlier.need} runs each: {stop}"
            return ""
        step.passed_undecided |= earlier.undecided  # an undecided race is not a "no": the stop says so
        return f"tried already ({earlier.words()})"  # where it was tried and what that race said

    def passed_over(self, step: Step) -> None:
        """The levers the step passed over and why, and what its diagnosis could not judge."""
        for skipped in step.passed_over:
            self.say(
                f"tune: step {step.index}:   passed over {skipped['lever']} ({skipped['cause']}): {skipped['why']}"
            )
        if step.unjudged:
            self.say(f"tune: step {step.index}:   the diagnosis could not judge: {'; '.join(step.unjudged)}")

    def refused(self, knobs: Mapping[str, Any]) -> str:
        """Why the configuration cannot run (its config, the engine, the hardware), or ''."""
        try:
            job = self.job_of(knobs)
        except ConfigError as exc:
            text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            return text.split("]: ", 1)[-1][:300]
        return assess(job.spec) or ""

    def over_budget(self, trials: int) -> str:
        if self.trials_run + trials > self.max_trials:
            return f"max_trials {self.max_trials}: {self.trials_run} run, the step needs {trials} or more"
        spent = time.monotonic() - self.started
        if self.max_wall_s is not None and spent >= self.max_wall_s:
            return f"max_wall_s {self.max_wall_s:g}: {spent:.0f} s spent"
        return ""

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
        lines = [self.overrides(c.knobs, step if requests_of is None else requests_of, extra) for c in candidates]
        results = self.launcher.launch(lines, initial_job_idx=self.job_idx)
        self.job_idx += len(lines)
        returns.append(results)
        named: dict[str, TrialData] = {}
        for c, ret in zip(candidates, results):
            out = ret.return_value if isinstance(ret.return_value, dict) else {}
            trial = out.get("trial")
            if trial is None:
                trial = TrialData(c.name, str(out.get("status", "NOT_RUN")), {}, {}, [], error=str(out.get("why", "")))
            named[c.name] = dataclasses.replace(trial, name=c.name)
            for run in [trial, *trial.runs]:
                if not run.trial_hash or run.trial_hash not in self.counted:
                    self.trials_run += 1
                    self.counted.add(run.trial_hash)
        return named

    def judge(
        self, step: Step, incumbent: Candidate, candidates: list[Candidate], named: dict[str, TrialData]
    ) -> Candidate | None:
        """The step's race: adopt a candidate that beats the incumbent, or keep it (a second look:
        on its first race's runs and the runs that continued it)."""
        for name, t in named.items():
            v = value_of(t, self.objective.key, self.objective.at) if t.status == "FINISHED" else None
            if v is not None:
                step.values[name] = (v.value, v.ci95 or 0.0)
        verdict = decide(list(named.values()), self.objective)
        out_of_race = [f"{t.name}: {why}" for t, why in verdict.excluded]
        state = race_over(verdict.feasible, self.objective) if len(verdict.feasible) >= 2 else None
        outcome = judge_step(state, incumbent.name, self.objective.key)
        step.decision = outcome.words + (f" (out of the race: {'; '.join(out_of_race)})" if out_of_race else "")
        adopted = next((c for c in candidates if c.name == outcome.adopted), None)
        if adopted is not None and outcome.comparison is not None:
            step.adopted, step.adopted_knobs = adopted.name, dict(adopted.knobs)
            step.gain = gain(outcome.comparison)
            step.log_scale = outcome.comparison.log_scale
        self.say(f"tune: step {step.index}: {step.decision}")
        raced = [Raced(c.name, c is incumbent, c.proposal, named.get(c.name)) for c in [incumbent, *candidates]]
        self.record.tag_step(step, raced)
        undecided = outcome.comparison is not None and outcome.comparison.outcome == UNDECIDED
        for c in candidates:
            looks = c.earlier.looks + 1 if c.earlier is not None else 1
            led = outcome.led_undecided == c.name
            runs = state.runs.get(c.name, 0) if state is not None else 0
            need = state.runs_to_decide(incumbent.name) if state is not None and led else None
            self.tried[identity(c.knobs)] = Tried(
                step.index, step.decision, identity(incumbent.knobs), undecided, led, looks, runs, need
            )
        return adopted

    def finish(self, best: Candidate, returns: list[Any]) -> None:
        """The best against the baseline (raced again when the path took several steps), the path
        in words, the files and the MLflow tags."""
        lines = path_lines(self.steps, self.objective)
        adopted = [s for s in self.steps if s.adopted]
        against = "the baseline is the best configuration found"
        if len(adopted) == 1:
            against = f"{best.name} against the baseline: {self.objective.key} {_gain_words(adopted[0])}"
        elif adopted:
            stop = self.over_budget(2)
            if stop:
                against = f"{best.name} against the baseline: not raced ({stop})"
            else:
                self.say(f"tune: racing {best.name} against the baseline")
                k = len(self.steps) + 1
                named = self.launch([Candidate(BASELINE, {}), best], k, returns)
                final = Step(k, BASELINE, "", [], trials=self.trials_run)
                self.judge(final, Candidate(BASELINE, {}), [best], named)
                against = f"{best.name} against the baseline: {self.objective.key} " + (
                    _gain_words(final) if final.adopted else final.decision
                )
        best_words = f"Best: {best.name}" + (f" ({knob_words(best.knobs)})" if best.name != name_of(best.knobs) else "")
        summary = [*lines, f"{best_words}; {against}. {self.trials_run} trials."]
        for line in summary:
            self.say(f"tune: {line}")
        self.record.write(
            self.objective, self.steps, {"name": best.name, "knobs": best.knobs}, self.trials_run, summary
        )

    def plan(self, base_job: TrialJob, engine: str, platform: str) -> list[Any]:
        """A dry run: the baseline's plan, and the levers it would consider first (every cause's,
        in the table's order, since nothing is diagnosed yet)."""
        returns = [self.launcher.launch([self.overrides({}, 0)], initial_job_idx=0)]
        current = self.engine_knobs(base_job)
        self.say("tune: dry run: nothing measured. The levers it would consider, by what the diagnosis names:")
        for cause, levers in self.levers.items():
            for lever in levers:
                p = propose(cause, lever, current, self.space, engine, platform, self.objective)
                why = p.skip or self.refused({**p.values})
                self.say(f"tune:   {cause}: {lever.name}: " + (f"passed over ({why})" if why else p.words(current)))
        return returns

    def say(self, line: str) -> None:
        """A progress line: on stdout, or on stderr under ``dry_run=json`` (stdout is the plan's JSON)."""
        print(line, file=sys.stderr if self.json_plan else sys.stdout, flush=True)


def run_tuning(hydra_context: Any, config: Any, launcher: Any, arguments: list[str], options: dict[str, Any]) -> Any:
    """The body of ``hydra/sweeper=tune``."""
    return Tuner(hydra_context, config, launcher, arguments, options).run()


def _gain_words(step: Step) -> str:
    return change_words(*step.gain, step.log_scale) if step.gain is not None else "no gain measured"
