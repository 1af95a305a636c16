"""What a tuning leaves (:mod:`orchestrator.tuning.loop`): ``tuning.json``, ``tuning.md``
and ``tuning.png`` in ``<sweep dir>/report`` (the path appended to its ``summary.md``), the
same files and ``tune_*`` tags on the sweep's MLflow run, and each step's trial runs tagged with
the step, their role, the cause and lever that made them and the step's decision. The files are
written first: MLflow is a copy."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config.schema import ObjectiveSpec
from orchestrator.decide.trials import TrialData
from orchestrator.tuning.candidates import Candidate
from orchestrator.tuning.moves import Proposal
from orchestrator.tuning.path import Step

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Raced:
    """One configuration of a step as MLflow tags it."""

    name: str
    incumbent: bool
    proposal: Proposal | None
    trial: TrialData | None


class TuningRecord:
    """The tuning's files and its MLflow tags (``uri`` None: tracking off)."""

    def __init__(self, sweep_dir: Path, uri: str | None, experiment: str) -> None:
        self.sweep_dir = sweep_dir
        self.uri, self.experiment = uri, experiment
        self._tracker: Any = None
        self._tagged: set[str] = set()  # the trial hashes a step has tagged

    def tracker(self) -> Any:
        """The sweep's MLflow tracker, attached to the tuning's parent run (None: tracking off)."""
        if self._tracker is None and self.uri is not None:
            try:
                from orchestrator.tracking import MlflowTracker

                tracker = MlflowTracker(self.uri, self.experiment)
                tracker.attach_sweep(str(self.sweep_dir))
            except Exception as exc:
                log.warning("tune: MLflow not reachable (%s); the path is kept on disk", exc)
                return None
            self._tracker = tracker
        return self._tracker

    def tag_step(self, step: Step, raced: Sequence[Raced]) -> None:
        """Each trial run of the step (first runs and the race's repeats), tagged; a run raced by
        an earlier step keeps that step's tags (a second look reads its first race's runs back)."""
        tracker = self.tracker()
        if tracker is None:
            return
        for r in raced:
            if r.trial is None or not r.trial.trial_hash:
                continue
            tags = {
                "tune_step": str(step.index),
                "tune_role": "incumbent" if r.incumbent else "candidate",
                "tune_config": r.name,
                "tune_limiter": step.headline,
                "tune_decision": step.decision,
            }
            if r.proposal is not None and not r.incumbent:
                tags |= {"tune_cause": r.proposal.cause, "tune_lever": r.proposal.lever.name}
            try:
                hashes = [
                    h for h in [r.trial.trial_hash, *(x.trial_hash for x in r.trial.runs)] if h not in self._tagged
                ]
                self._tagged.update(hashes)
                for run_id in tracker.run_ids_of(hashes):
                    for k, v in tags.items():
                        tracker.client.set_tag(run_id, k, v[:5000])
            except Exception as exc:  # the path is on disk: MLflow is a copy
                log.warning("tune: could not tag step %d's runs in MLflow (%s)", step.index, exc)

    def write(
        self, objective: ObjectiveSpec, steps: list[Step], best: Candidate, trials: int, summary: list[str]
    ) -> None:
        """The files, then the same on the sweep's MLflow run."""
        out = self.sweep_dir / "report"
        out.mkdir(parents=True, exist_ok=True)
        data = {
            "objective": objective.model_dump(mode="json"),
            "steps": [s.as_json() for s in steps],
            "best": {"name": best.name, "knobs": best.knobs},
            "trials": trials,
            "path": summary,
        }
        files = [out / "tuning.json", out / "tuning.md"]
        files[0].write_text(json.dumps(data, indent=2, default=str))
        text = "\n".join(["## Tuning path", "", *(f"- {line}" for line in summary), ""])
        files[1].write_text("# Tuning\n\n" + text + "\n![the objective per step](tuning.png)\n")
        if plot_path(steps, objective, out / "tuning.png"):
            files.append(out / "tuning.png")
        report = out / "summary.md"
        if report.exists():
            report.write_text(report.read_text() + "\n" + text)
            files.append(report)
        tracker = self.tracker()
        if tracker is None:
            return
        try:
            tracker.set_sweep_tags(
                {"tune_path": "\n".join(summary), "tune_best": best.name, "tune_steps": str(len(steps))}
            )
            tracker.log_sweep_files(files, "report")
        except Exception as exc:  # the files are on disk: MLflow is a copy
            log.warning("tune: could not log the path to MLflow (%s); it is in %s", exc, self.sweep_dir)


def plot_path(steps: Sequence[Step], objective: ObjectiveSpec, path: Path) -> bool:
    """The objective per step, each configuration raced in it with its 95% interval over its
    runs, the incumbent's line through the steps; whether a plot was made."""
    measured = [s for s in steps if s.values]
    if not measured:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    line = []
    for s in measured:
        others = sorted(n for n in s.values if n != s.incumbent)
        spots = [(s.incumbent, -0.2)] + [(n, 0.4 * (i + 1) / len(others) - 0.1) for i, n in enumerate(others)]
        for name, dx in spots:
            if name not in s.values:
                continue
            mean, half = s.values[name]
            kept = name == (s.adopted or s.incumbent)
            ax.errorbar(
                s.index + dx,
                mean,
                yerr=half or None,
                fmt="o" if name == s.incumbent else "s",
                color="C0" if name == s.incumbent else "C1",
                capsize=3,
                alpha=1.0 if kept else 0.45,
            )
            ax.annotate(name, (s.index + dx, mean), fontsize=7, xytext=(4, 4), textcoords="offset points")
            if kept:
                line.append((s.index + dx, mean))
    if len(line) > 1:
        ax.plot(*zip(*line), "-", color="C2", alpha=0.6, label="the configuration kept at each step")
        ax.legend(fontsize=8)
    ax.set_xticks([s.index for s in measured], [f"step {s.index}" for s in measured])
    ax.set_xlim(min(s.index for s in measured) - 0.5, max(s.index for s in measured) + 0.5)
    ax.set_xlabel("circles: the incumbent; squares: the candidates raced beside it")
    ax.set_ylabel(objective.key + (f" at {objective.at}" if objective.at else ""))
    ax.set_title("Tuning path: the objective per step (95% interval over runs)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
