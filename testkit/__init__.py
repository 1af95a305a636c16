"""What the tests and the benchmarks share: a scripted fake OpenAI-compatible server
(:mod:`testkit.fake_openai_server`), composing a config as the CLI does (:mod:`testkit.compose`),
and races on a simulated machine or against the fake server (:mod:`testkit.races`). Not part of
the installed product; imported from the project root (``python -m pytest``, ``python -m
benchmarks.NAME``)."""
