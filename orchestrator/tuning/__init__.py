"""The tuner (``hydra/sweeper=tune``): from a baseline configuration, diagnose, act on what limited
it, race the moves beside it and adopt one only on the race's word (docs/tuning.md).

``loop`` (:class:`~orchestrator.tuning.loop.Tuner`: the steps, their launches, the final race),
``planner`` (what a step tries: the diagnosis's causes, the limiter first, each cause's levers),
``levers`` (the lever table), ``moves`` (what a lever proposes from a configuration), ``space``
(the knobs it may move), ``judging`` (whether a step's race adopts), ``path`` (the steps as the
record keeps them), ``candidates`` (configurations, their identity and what their races said),
``configs`` (configurations as Hydra composes them), ``record`` (its files and MLflow tags),
``options`` (its options, as the Hydra plugin declares them; light: imported at every start)."""
