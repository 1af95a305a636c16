"""Deciding: a trial's value of the objective and whether it meets the constraints
(:mod:`~orchestrator.decide.objective`), the race's statistics and its stopping rule
(:mod:`~orchestrator.decide.race`, :mod:`~orchestrator.decide.looks`), the sweep's verdict
(:mod:`~orchestrator.decide.verdict`, a knob's in :mod:`~orchestrator.decide.knobs`), and the
SLO capacity search (:mod:`~orchestrator.decide.capacity`). Pure logic over measured numbers:
it runs nothing; the scheduler and the trial call it."""
