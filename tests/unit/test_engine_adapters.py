"""The engine adapter registry (one class per engine, found by its spec's ``name``), the
typed narrowing of a trial's engine spec, and the flag tables argv builders are made of."""

from __future__ import annotations

import typing

import pytest

from orchestrator.config import to_specs
from orchestrator.config.errors import ConfigError
from orchestrator.config.schema import EngineSpec, SleepEngineSpec
from orchestrator.engines import ADAPTERS, LaunchContext, adapter_for
from orchestrator.engines.base import EngineAdapter, engine_name, register
from orchestrator.engines.flags import Flag, render


def test_every_engine_spec_has_exactly_one_adapter():
    (union, _field) = typing.get_args(EngineSpec)
    specs = typing.get_args(union)
    assert sorted(engine_name(s) for s in specs) == sorted(ADAPTERS)
    for spec_type in specs:
        adapter = adapter_for(engine_name(spec_type))
        assert adapter.spec_type is spec_type and adapter.name == engine_name(spec_type)


def test_unknown_engine_names_the_known_ones():
    with pytest.raises(ConfigError, match="engine.name: unknown engine 'tgi'; expected one of: vllm, .*sleep"):
        adapter_for("tgi")


def test_an_adapter_refuses_another_engines_spec(compose):
    spec, _ = to_specs(compose(["engine=sleep"]))
    with pytest.raises(TypeError, match="the vllm adapter got an engine spec of 'sleep'"):
        adapter_for("vllm").launches(spec, LaunchContext("/m", 8000, lambda: 0, "/t"))


def test_defaults_are_nothing_and_a_second_adapter_is_refused(compose):
    spec, _ = to_specs(compose(["engine=sleep", "engine.seconds=0"]))
    sleep = adapter_for("sleep")
    assert sleep.launches(spec, LaunchContext("/m", 0, lambda: 0, "/t")) == []
    nothing = (sleep.unsupported(spec), sleep.cache_reset(spec), sleep.api_key(spec), sleep.profiler(spec, "/t"))
    assert nothing == (None, None, None, None)
    assert sleep.metrics_for(spec) == {} and sleep.version(spec) == "sleep"
    assert set(sleep.hold(spec) or {}) == {"held_s"}

    class Again(EngineAdapter[SleepEngineSpec]):
        spec_type = SleepEngineSpec

        def launches(self, spec, model_path, port, next_port, workdir):
            return []

    with pytest.raises(TypeError, match="engine 'sleep' has two adapters: SleepAdapter and Again"):
        register(Again)
    assert type(ADAPTERS["sleep"]).__name__ == "SleepAdapter"


def test_flag_kinds_write_nothing_for_none():
    rows = (
        Flag("a", lambda d: d["a"]),
        Flag("b", lambda d: d["b"], "bool"),
        Flag("c", lambda d: d["c"], "switch"),
        Flag("d", lambda d: d["d"], "json"),
    )
    assert render(rows, {"a": None, "b": None, "c": None, "d": None}) == []
    assert render(rows, {"a": 0, "b": False, "c": False, "d": {}}) == ["--a", "0", "--no-b", "--d", "{}"]
    assert render(rows, {"a": "x", "b": True, "c": True, "d": {"z": 1, "y": 2}}) == [
        *("--a", "x", "--b", "--c"),
        *("--d", '{"y": 2, "z": 1}'),
    ]


def test_the_cpu_build_refuses_a_block_size_its_attention_cannot_hold(compose):
    """A block size the CPU attention backend refuses is a SKIPPED trial with its reason, before
    any server starts (the same sweep on real vLLM: test_sweep_cli.py, `make test-long`)."""
    vllm = adapter_for("vllm")
    for size, said in ((16, "block_size 16: the CPU attention backend needs a multiple of 32"), (32, None)):
        spec, _ = to_specs(compose([f"engine.block_size={size}"]))
        assert vllm.unsupported(spec) == said
