"""Typed config: validation errors name the key, overlays, the trial hash."""

from __future__ import annotations

import re

import pytest

from orchestrator.config import ConfigError, to_specs, trial_hash
from orchestrator.config.convert import apply_overlays, config_to_dict


def test_default_config_validates(compose):
    spec, settings = to_specs(compose())
    assert spec.engine.name == "vllm"
    assert spec.model.source == "tiny_random"
    assert spec.platform.name == "cpu"
    assert spec.engine.dtype == "float32"  # from platform=cpu
    assert settings.tracking.uri.startswith("sqlite:///") and settings.tracking.uri.endswith("mlflow.db")


def test_unknown_engine_key_names_key_and_allowed(compose):
    cfg = compose(["+engine.max_num_batched_tokenz=5"])
    with pytest.raises(ConfigError) as err:
        to_specs(cfg)
    msg = str(err.value)
    assert "engine.max_num_batched_tokenz" in msg
    assert "max_num_batched_tokens" in msg  # the allowed keys are listed


def test_wrong_type_names_key(compose):
    with pytest.raises(ConfigError, match=r"engine\.max_num_seqs"):
        to_specs(compose(["engine.max_num_seqs=lots"]))


def test_negative_rate_rejected(compose):
    with pytest.raises(ConfigError, match=r"workload\.load_points\.0\.rate"):
        to_specs(compose(["workload.load_points=[{rate:-1}]"]))


def test_point_needs_one_arrival(compose):
    with pytest.raises(ConfigError, match="exactly one of 'concurrency', 'rate' or 'trace'"):
        to_specs(compose(["workload.load_points=[{rate:1,concurrency:2}]"]))


def test_unknown_variant_lists_choices(compose):
    cfg = compose(["+experiment=chunked_prefill", "variant=budget_7"])
    with pytest.raises(ConfigError, match="unknown value 'budget_7'.*budget_256"):
        to_specs(cfg)


def test_unknown_top_level_key(compose):
    with pytest.raises(ConfigError, match="unknown top-level key.*bogus"):
        to_specs(compose(["+bogus=1"]))


def test_context_overflow_rejected(compose):
    with pytest.raises(ConfigError, match="needs up to .* tokens"):
        to_specs(compose(["engine.max_model_len=100"]))


def test_overlays_per_platform_then_variant():
    data = {
        "platform": {"name": "cpu"},
        "engine": {"a": 1, "b": 1},
        "variant": "v",
        "variants": {"v": {"engine": {"b": 3}}},
        "per_platform": {"cpu": {"engine": {"a": 2, "b": 2}}, "gpu": {"engine": {"a": 9}}},
    }
    out = apply_overlays(data)
    assert out["engine"] == {"a": 2, "b": 3}
    assert "variants" not in out and "per_platform" not in out


def test_a_platforms_form_of_a_variant_applies_after_the_variant():
    data = {
        "platform": {"name": "cpu"},
        "engine": {"a": 1, "b": 1, "c": 1},
        "variant": "v",
        "variants": {"v": {"engine": {"b": 3, "c": 3}}},
        "per_platform": {"cpu": {"engine": {"a": 2}, "variants": {"v": {"engine": {"c": 4}}, "only_cpu": {}}}},
    }
    assert apply_overlays(data)["engine"] == {"a": 2, "b": 3, "c": 4}
    replaced = dict(data, per_platform={"cpu": {"variants": {"v": {"engine": {"_replace_": True, "z": 0}}}}})
    assert apply_overlays(replaced)["engine"] == {"z": 0}
    assert apply_overlays(dict(data, variant="only_cpu"))["engine"] == {"a": 2, "b": 1, "c": 1}
    with pytest.raises(ConfigError, match="expected one of: only_cpu, v"):
        apply_overlays(dict(data, variant="nope"))
    with pytest.raises(ConfigError, match="per_platform.cpu.variants: expected a mapping"):
        apply_overlays(dict(data, per_platform={"cpu": {"variants": [1]}}))
    with pytest.raises(ConfigError, match="per_platform.cpu.variants.v: cannot set 'sweeps'"):
        apply_overlays(dict(data, per_platform={"cpu": {"variants": {"v": {"sweeps": 1}}}}))


def test_overlay_may_not_rename_experiment():
    with pytest.raises(ConfigError, match="cannot set 'experiment'"):
        apply_overlays({"variant": "v", "variants": {"v": {"experiment": "x"}}, "platform": {"name": "cpu"}})


def test_trial_hash_stable_and_ignores_port(compose):
    a, _ = to_specs(compose())
    b, _ = to_specs(compose(["engine.port=8000", "engine.startup_timeout_s=5"]))
    c, _ = to_specs(compose(["engine.max_num_batched_tokens=512"]))
    assert trial_hash(a) == trial_hash(b)
    assert trial_hash(a) != trial_hash(c)
    assert len(trial_hash(a)) == 16


def test_config_to_dict_drops_hydra_node(compose):
    data = config_to_dict(compose())
    assert "hydra" not in data and data["experiment"] == "default"


def test_extra_args_may_not_override_managed_flags(compose):
    with pytest.raises(ConfigError, match="extra_args may not set --port; use engine.port"):
        to_specs(compose(["engine.extra_args=[--port,9000]"]))


def test_sweep_settings_must_not_vary_between_jobs(compose):
    from orchestrator.config.convert import config_to_dict
    from orchestrator.scheduling.jobs import prepare_jobs

    a = config_to_dict(compose(["tracking.uri=sqlite:////tmp/a.db"]))
    b = config_to_dict(compose(["tracking.uri=sqlite:////tmp/b.db"]))
    with pytest.raises(ConfigError, match="tracking: must be the same for every trial"):
        prepare_jobs([(["x"], a), (["y"], b)])
    c = config_to_dict(compose(["tracking.uri=sqlite:////tmp/a.db", "workload.num_requests=9"]))
    assert len(prepare_jobs([(["x"], a), (["y"], c)])) == 2


def test_two_jobs_of_one_configuration_are_refused_naming_what_differs(compose):
    """Two names for one configuration (one trial hash) would share a result's identity, and a
    race would count each one's runs as the other's: refused before anything starts."""
    from orchestrator.config.convert import config_to_dict
    from orchestrator.scheduling.jobs import prepare_jobs

    extra = ["+variants.a={}", "+variants.b={}"]
    a = config_to_dict(compose([*extra, "variant=a"]))
    b = config_to_dict(compose([*extra, "variant=b", "engine.port=8123"]))
    with pytest.raises(ConfigError) as err:
        prepare_jobs([(["variant=a"], a), (["variant=b", "engine.port=8123"], b)])
    msg = str(err.value)
    assert "job 0 (a) and job 1 (b) are one configuration (trial hash" in msg
    assert "they differ only in variant=a vs variant=b engine.port=8123, which changes nothing measured" in msg
    assert "objective.max_repeats" in msg
    with pytest.raises(ConfigError, match="their overrides are the same"):
        prepare_jobs([(["x=1"], a), (["x=1"], a)])
    # a search's batch may ask one configuration twice (its answer is read back)
    assert len(prepare_jobs([(["x"], a), (["y"], a)], whole_sweep=False)) == 2


def test_unknown_key_lists_the_keys_of_the_chosen_engine(compose):
    with pytest.raises(ConfigError) as err:
        to_specs(compose(["engine=external", "engine.url=http://127.0.0.1:1", "+engine.block_size=32"]))
    msg = str(err.value)
    assert "engine.block_size: unknown key" in msg and "api_key_env" in msg and "metrics_path" in msg


def test_rate_inf_survives_the_json_trip_to_ray_workers(compose):
    """Ray ships specs as JSON; pydantic's default wrote inf as null and the worker rejected it."""
    from orchestrator.config.schema import TrialSpec

    spec, _ = to_specs(compose(["workload.load_points=[{rate:inf}]", "workload.num_requests=4"]))
    back = TrialSpec.model_validate_json(spec.model_dump_json())
    assert back.workload.load_points[0].rate == float("inf") and back == spec


def test_relative_file_paths_become_absolute_where_the_command_runs(compose, tmp_path, monkeypatch):
    """Trials run in Ray workers and their tools in folders of their own: a relative path in
    the config is fixed against the directory the sweep was started in, once."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tok").mkdir()
    monkeypatch.chdir(tmp_path)
    spec, _ = to_specs(
        compose(
            [
                "workload=sharegpt",
                "workload.classes.main.path=data/sg.json",
                "workload.load_points=[{trace:data/t.jsonl},{concurrency:2}]",
                "model.source=path",
                "model.path=data/model",
                "model.tokenizer=data/tok",
                "model.cache_dir='~/models'",
                "+engine.lmcache={local_disk:kv}",
                "engine.python=envs/bin/python",
            ]
        )
    )
    assert spec.workload.classes["main"].path == str(tmp_path / "data" / "sg.json")
    assert spec.workload.load_points[0].trace == str(tmp_path / "data" / "t.jsonl")
    assert spec.model.tokenizer == str(tmp_path / "data" / "tok")
    assert spec.model.path == str(tmp_path / "data" / "model")
    import os

    assert spec.model.cache_dir == os.path.expanduser("~/models")
    assert spec.engine.lmcache.local_disk == str(tmp_path / "kv")
    assert spec.engine.python == str(tmp_path / "envs" / "bin" / "python")
    # hub ids stay ids; a bare interpreter name is looked up on PATH; a container's interpreter is its own
    hub, _ = to_specs(
        compose(["model.source=hub", "model.path=org/model", "model.tokenizer=org/model", "engine.python=python3"])
    )
    assert (hub.model.path, hub.model.tokenizer, hub.engine.python) == ("org/model", "org/model", "python3")
    boxed, _ = to_specs(compose(["engine.python=bin/python", "engine.launch_prefix=[apptainer,exec,img.sif]"]))
    assert boxed.engine.python == "bin/python"


def test_the_command_line_wins_over_an_experiments_overlays(compose, caplog):
    """An experiment's per_platform and variants overlays are applied after Hydra composed the
    command line: a key typed there still wins (it was silently replaced by the CPU overlay's
    value). A group's choice is no typed key: the overlay still scales the chosen group's file."""
    from orchestrator.config.convert import config_to_dict

    def spec_of(*overrides: str):
        return to_specs(config_to_dict(compose(list(overrides))), overrides)[0]

    plain = spec_of("+experiment=chunked_prefill", "variant=budget_256")
    assert (plain.workload.num_requests, plain.engine.max_model_len) == (24, 2048)  # the CPU overlay's
    typed = spec_of(
        "+experiment=chunked_prefill", "variant=budget_256", "workload.num_requests=500", "engine.max_model_len=4096"
    )
    assert (typed.workload.num_requests, typed.engine.max_model_len) == (500, 4096)
    assert typed.engine.max_num_batched_tokens == 256 and typed.workload.classes["long"].input_tokens == 1024
    chosen = spec_of("+experiment=chunked_prefill", "variant=budget_256", "workload=mixed_long_short")
    assert chosen.workload.num_requests == 24 and chosen.workload.classes["long"].input_tokens == 1024
    assert (
        spec_of("+experiment=chunked_prefill", "variant=budget_256", "engine.max_model_len=null").engine.max_model_len
        is None
    )
    with caplog.at_level("WARNING"):
        replaced = spec_of("+experiment=chunked_prefill", "variant=budget_256", "engine.max_num_batched_tokens=300")
    assert replaced.engine.max_num_batched_tokens == 300
    assert (
        "engine.max_num_batched_tokens: the command line's value replaces variant budget_256's (256 -> 300)"
        in caplog.text
    )
    # a variant that replaces the engine (another engine's keys): the key typed for the one it
    # replaced is not put into it (SGLang has no enable_chunked_prefill: the sweep was refused)
    with caplog.at_level("WARNING"):
        other = spec_of("+experiment=first_serving", "variant=sglang", "engine.enable_chunked_prefill=false")
    assert other.engine.name == "sglang"
    assert "engine.enable_chunked_prefill: the command line's value is not applied to variant sglang" in caplog.text


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://127.0.0.1:99999", "expected a port from 1 to 65535 after the host"),
        ("http://127.0.0.1:abc", "expected a port from 1 to 65535 after the host"),
        ("http://h:8000/v1", "expected the server's root, http(s)://host:port, no path (the client adds /v1/...)"),
        ("ftp://h:1", "expected http(s)://host:port"),
        ("http://:80", "expected a host and a port"),
    ],
)
def test_an_external_servers_url_is_checked_part_by_part(compose, url, said):
    """A port out of range or not a number was a traceback inside the trial; each mistake is now
    a line naming engine.url, before anything starts."""
    with pytest.raises(ConfigError) as err:
        to_specs(compose(["engine=external", f"engine.url={url}"]))
    assert f"engine.url: {said}" in str(err.value) and f"(got '{url}')" in str(err.value)


def test_an_external_servers_root_with_a_slash_is_its_root(compose):
    spec, _ = to_specs(compose(["engine=external", "engine.url=http://h:8000/"]))
    assert spec.engine.url == "http://h:8000"


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ("{num_speculative_tokens:4}", "expected 'method' (ngram, eagle, eagle3, mtp, draft_model, ...) or 'model'"),
        ("{method:eagle,num_speculative_tokens:4}", "method eagle needs 'model' (its draft model or head)"),
        ("{method:ngram,num_speculative_tokens:-1}", "num_speculative_tokens: expected a whole number >= 1, got -1"),
    ],
)
def test_a_speculative_config_vllm_cannot_start_with_is_refused_by_name(compose, config, said):
    with pytest.raises(ConfigError, match=re.escape(f"engine.speculative_config: {said}")):
        to_specs(compose([f"engine.speculative_config={config}"]))


def test_speculative_configs_vllm_takes_pass(compose):
    for config in (
        "{method:ngram,num_speculative_tokens:3,prompt_lookup_max:4}",
        "{method:mtp,num_speculative_tokens:1}",
    ):
        assert to_specs(compose([f"engine.speculative_config={config}"]))[0].engine.speculative_config


def test_a_check_across_sections_is_said_without_a_root_prefix(compose):
    """A check that reads two sections names its keys in its message: '<root>:' before it said nothing."""
    with pytest.raises(ConfigError) as err:
        to_specs(compose(["engine.max_model_len=64"]))
    assert "<root>" not in str(err.value)
    assert "\n  workload 'short_short' needs up to 192 tokens per request" in str(err.value)


def test_a_tracking_uri_mlflow_cannot_open_is_refused_before_anything_starts(compose):
    with pytest.raises(ConfigError, match=r"tracking.uri: 'foo' is no MLflow store: expected sqlite:///FILE.db"):
        to_specs(compose(["tracking.uri=foo://bar"]))
    for uri in (
        "sqlite:///mlflow.db",
        "http://mlflow:5000",
        "postgresql+psycopg2://u@h/db",
        "file:///tmp/mlruns",
        "mlruns",
    ):
        assert to_specs(compose([f"tracking.uri={uri}"]))[1].tracking.uri == uri


def test_a_knob_is_a_key_of_the_schema_not_of_the_trials_at_hand():
    """The verdict's knobs are checked against the schema (any engine's keys, free-form mappings
    such as speculative_config): a sweep of the baseline alone (speculative_config null) or one
    batch of a search was refused for a knob its trials did not happen to set."""
    from orchestrator.config.convert import is_config_key

    for key in (
        "engine.max_num_batched_tokens",
        "engine.speculative_config.num_speculative_tokens",
        "engine.schedule_policy",  # SGLang's
        "workload.classes.short.input_tokens",
        "model.tiny.quantization",
    ):
        assert is_config_key(key), key
    for key in ("engine.max_num_batched_tokenz", "workload.classes.short.nope", "enginex.block_size"):
        assert not is_config_key(key), key


def test_a_load_point_is_one_typed_kind_of_arrivals():
    """LoadPointSpec.load: the one arrival setting the validator left, as its own type, with the
    fields of that kind only (code matches on it instead of asking which field is set)."""
    from orchestrator.config.schema import ClosedLoop, LoadPointSpec, OpenLoop, TraceReplay

    assert LoadPointSpec(concurrency=4).load == ClosedLoop(4)
    capped = LoadPointSpec(rate=2.5, max_concurrency=3, arrival="gamma", burstiness=0.5, ramp_up_s=1.0).load
    assert capped == OpenLoop(2.5, "gamma", 0.5, 1.0, 3)
    replay = LoadPointSpec(trace="t.jsonl", time_scale=2.0, trace_start_s=30.0, max_context_tokens=1024).load
    assert isinstance(replay, TraceReplay)
    assert (replay.path, replay.time_scale, replay.start_s, replay.max_context_tokens) == ("t.jsonl", 2.0, 30.0, 1024)
    assert (replay.format, replay.length_scale, replay.over_context) == ("auto", 1.0, "truncate")
