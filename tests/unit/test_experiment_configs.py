"""Every experiment config composes and every trial of its sweep validates, on every platform."""

from __future__ import annotations

import pytest

from orchestrator.config import to_specs, trial_hash
from tests.conftest import CONF

EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
PLATFORMS = sorted(p.stem for p in (CONF / "platform").glob("*.yaml"))


def test_there_are_experiments():
    assert "chunked_prefill" in EXPERIMENTS


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_sweep_validates(compose, experiment, platform):
    base = compose([f"+experiment={experiment}", f"platform={platform}"])
    sweep = (base.get("sweeps") or {}).get(platform)
    variants = [v.strip() for v in str(sweep).split(",")] if sweep else [None]
    hashes = set()
    for variant in variants:
        overrides = [f"+experiment={experiment}", f"platform={platform}"]
        if variant:
            overrides.append(f"variant={variant}")
        spec, _ = to_specs(compose(overrides))
        assert spec.experiment == experiment
        assert spec.platform.name == platform
        hashes.add(trial_hash(spec))
    assert len(hashes) == len(variants), "two variants of one sweep produce the same trial"


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_variant_validates_on_the_gpu(compose, experiment):
    """A variant left out of the GPU sweep is still one a user can run there (`variant=rank_64
    platform=gpu`), and `make test-engines` checks every variant's GPU command: each validates.
    (On the CPU a GPU-scale variant may not fit the CPU model's context: that is a ConfigError
    naming the key, tested with the sweeps above.)"""
    base = compose([f"+experiment={experiment}", "platform=gpu"])
    for variant in base.get("variants") or {}:
        spec, _ = to_specs(compose([f"+experiment={experiment}", "platform=gpu", f"variant={variant}"]))
        assert spec.variant == variant


def test_a_platform_gives_a_variant_a_form_of_its_own(compose):
    """per_platform.<platform>.variants.<variant> applies after the variant: multi_lora's rank_64
    trains rank-64 tiny adapters on the CPU and raises the slots' rank over one's own on a GPU."""
    cpu = to_specs(compose(["+experiment=multi_lora", "platform=cpu", "variant=rank_64"]))[0]
    gpu = to_specs(compose(["+experiment=multi_lora", "platform=gpu", "variant=rank_64"]))[0]
    assert cpu.model.lora.tiny.rank == 64 and cpu.model.lora.tiny.count == 4 and not cpu.model.lora.adapters
    assert cpu.engine.max_lora_rank == 64
    assert gpu.model.lora.tiny is None and len(gpu.model.lora.adapters) == 8
    assert gpu.engine.max_lora_rank == 64
    active_4 = to_specs(compose(["+experiment=multi_lora", "platform=cpu", "variant=active_4"]))[0]
    assert active_4.model.lora.tiny.rank == 8  # the form is the variant's alone


WORKLOADS = sorted(p.stem for p in (CONF / "workload").glob("*.yaml") if not p.stem.startswith("_"))


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_workload_validates(compose, workload, platform):
    spec, _ = to_specs(compose([f"workload={workload}", f"platform={platform}"]))
    assert spec.workload.name == workload


def _models(annotation: object) -> list[type]:
    import types
    import typing

    from pydantic import BaseModel

    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _models(a)]
    return [annotation] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []


def _unset(model: type, cfg: object, prefix: str) -> list[str]:
    """The schema's fields (nested sections too) that the composed config does not hold: each
    would need a '+' to be overridden."""
    from omegaconf import OmegaConf

    out = []
    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        if not OmegaConf.is_dict(cfg) or name not in cfg:  # type: ignore[operator]
            out.append(prefix + name)
            continue
        sub = cfg[name]  # type: ignore[index]
        for m in _models(field.annotation)[:1]:
            if OmegaConf.is_dict(sub) and m.__name__ != "LoadPointSpec":  # a point is data, as in load_points
                out += _unset(m, sub, f"{prefix}{name}.")
    return out


GROUPS = {
    group: sorted(p.stem for p in (CONF / group).glob("*.yaml") if not p.stem.startswith("_"))
    for group in ("workload", "platform", "eval", "model", "engine")
}


@pytest.mark.parametrize("group,option", [(g, o) for g, opts in GROUPS.items() for o in opts])
def test_every_schema_field_is_overridable_as_written(compose, group, option):
    """``workload.client_nodes=2`` and ``workload.fidelity.max_prompt_tokens_error=0.2`` work
    without a '+': every field of a section's schema is in every option of its config group."""
    from orchestrator.config.schema import TrialSpec

    overrides = [f"{group}={option}"] + (["engine.url=http://127.0.0.1:1"] if option == "external" else [])
    cfg = compose(overrides)
    section = cfg[group]
    models = _models(TrialSpec.model_fields[group].annotation)
    if group == "engine":  # the engine spec of this option's kind
        models = [m for m in models if str(section.name) in str(m.model_fields["name"].annotation)]
    assert models, (group, option)
    assert _unset(models[0], section, f"{group}.") == []


# The 16 labs of the course (../shared/seeds/003_*) and the workload card (000_*).
LABS = [
    "first_serving",
    "offline_throughput",
    "roofline",
    "paged_attention",
    "prefix_caching",
    "radix_attention",
    "continuous_batching",
    "chunked_prefill",
    "scheduling_policies",
    "cuda_graphs",
    "speculative_decoding",
    "quantization",
    "tensor_parallel",
    "moe",
    "lmcache",
    "disaggregated_pd",
    "serving_workloads",
]
GPU_ONLY = {"radix_attention", "moe", "lmcache"}
# Labs whose CPU sweep runs what the CPU build can and SKIPS the GPU-only trials with the reason.
PARTLY_CPU = {
    "disaggregated_pd": {"pd_cpu_in1000", "standard_in1000"},
    "quantization": {"cpu_fp32", "cpu_w8a8", "cpu_bf16", "cpu_w4a16"},
    "scheduling_policies": {"dp2_round_robin", "dp2_cache_aware"},
}


def _cpu_runs(experiment: str) -> set[str]:
    """The variants of a partly-CPU lab that run on this machine: W4A16 only where this
    machine's vLLM CPU build has its 4-bit kernel (its AVX-512 libraries; not AVX2)."""
    import sys

    from orchestrator.engines import cpu_kernels

    runs = set(PARTLY_CPU[experiment])
    if experiment == "quantization" and cpu_kernels.missing_for("w4a16", sys.executable):
        runs.discard("cpu_w4a16")
    return runs


def test_every_lab_has_an_experiment():
    assert set(LABS) <= set(EXPERIMENTS)


def _sweep_specs(compose, experiment, platform):
    base = compose([f"+experiment={experiment}", f"platform={platform}"])
    for variant in str(base["sweeps"][platform]).split(","):
        yield to_specs(compose([f"+experiment={experiment}", f"platform={platform}", f"variant={variant.strip()}"]))[0]


@pytest.mark.parametrize("experiment", LABS)
def test_cpu_feasibility_per_lab(compose, experiment):
    """GPU-only labs: every CPU trial is SKIPPED with a reason; the others run on the CPU build."""
    from orchestrator.feasibility import assess

    specs = list(_sweep_specs(compose, experiment, "cpu"))
    reasons = [assess(spec, cluster_gpus=0) for spec in specs]
    if experiment in PARTLY_CPU:
        runs = {s.variant for s, r in zip(specs, reasons) if r is None}
        assert runs == _cpu_runs(experiment), reasons
    elif experiment in GPU_ONLY:
        assert all(reasons), reasons
    else:
        assert reasons == [None] * len(reasons)


@pytest.mark.parametrize("experiment", LABS)
def test_gpu_scale_is_feasible_on_the_course_hardware(compose, experiment):
    """On the course's A100-80GB with enough GPUs, every GPU trial passes feasibility."""
    from orchestrator.feasibility import assess

    for spec in _sweep_specs(compose, experiment, "gpu"):
        assert assess(spec, cluster_gpus=4) is None, spec.variant


def test_infeasible_gpu_trials_say_why(compose):
    from orchestrator.feasibility import assess

    tp4 = to_specs(compose(["+experiment=tensor_parallel", "platform=gpu", "variant=tp4"]))[0]
    assert "needs 4 GPU(s) but the cluster has 2" in assess(tp4, cluster_gpus=2)
    tp3 = to_specs(compose(["platform=gpu", "engine.tensor_parallel_size=3"]))[0]
    assert "does not divide" in assess(tp3, cluster_gpus=4)
    small = to_specs(compose(["platform=gpu", "platform.gpu_memory_gb=16"]))[0]
    assert "leave no room for the KV cache" in assess(small, cluster_gpus=1)
    tight = to_specs(compose(["platform=gpu", "platform.gpu_memory_gb=24", "engine.max_model_len=131072"]))[0]
    assert "the KV cache holds" in assess(tight, cluster_gpus=1)


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (
            ["engine.enable_chunked_prefill=false", "engine.max_num_batched_tokens=256", "engine.max_model_len=2048"],
            "engine.max_num_batched_tokens 256 is less than engine.max_model_len 2048 with chunked prefill off",
        ),
        (
            ["engine.max_num_batched_tokens=64", "engine.max_num_seqs=128"],
            "engine.max_num_batched_tokens 64 is less than engine.max_num_seqs 128",
        ),
        (
            ["engine.max_model_len=100000"],
            "engine.max_model_len 100000 is more than the model takes (8192, the tiny model's max_position_embeddings)",
        ),
    ],
)
def test_what_vllm_would_refuse_at_its_start_is_skipped_with_the_reason_first(compose, overrides, said):
    """vLLM's scheduler and length checks, said before any server starts (they were its start-up
    traceback a minute later); the same settings within its rules run."""
    from orchestrator.feasibility import assess

    spec = to_specs(compose(overrides))[0]
    assert said in (assess(spec, cluster_gpus=0) or "")
    fine = ["engine.enable_chunked_prefill=true", "engine.max_num_batched_tokens=256", "engine.max_num_seqs=8"]
    assert assess(to_specs(compose(fine))[0], cluster_gpus=0) is None
    # max_model_len left to vLLM: the length it derives also reads the tokenizer; not guessed
    unset = ["engine.enable_chunked_prefill=false", "engine.max_num_batched_tokens=256"]
    assert assess(to_specs(compose(unset))[0], cluster_gpus=0) is None
    allowed = ["engine.max_model_len=100000", "+engine.env.VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"]  # a number: its text
    long = to_specs(compose(allowed))[0]
    assert long.engine.env["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] == "1"
    assert "more than the model takes" not in (assess(long, cluster_gpus=0) or "")


# The workload card compares two workloads, not configurations: no verdict to give.
NO_OBJECTIVE = {"serving_workloads"}


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("experiment", LABS)
def test_every_lab_declares_its_question(compose, experiment, platform):
    """Each lab's sweep ends with a verdict: its objective names a point that the lab measures."""
    specs, settings = [], None
    base = compose([f"+experiment={experiment}", f"platform={platform}"])
    for variant in str(base["sweeps"][platform]).split(","):
        spec, settings = to_specs(
            compose([f"+experiment={experiment}", f"platform={platform}", f"variant={variant.strip()}"])
        )
        specs.append(spec)
    if experiment in NO_OBJECTIVE:
        assert settings.objective is None
        return
    goal = settings.objective
    assert goal is not None, f"{experiment} declares no objective"
    if goal.at is not None:
        for spec in specs:
            assert goal.at in [p.label for p in spec.workload.load_points], (spec.variant, goal.at)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_declares_checkable_expectations(compose, experiment):
    """Each lab says what it expects to observe (issue 33); every trial a claim names is one of
    its variants, every knob a trend runs along is a config key, every limiter a word of the
    diagnosis's vocabulary."""
    from orchestrator.metrics.diagnosis import VOCABULARY

    base = compose([f"+experiment={experiment}"])
    _, settings = to_specs(compose([f"+experiment={experiment}", f"variant={next(iter(base.variants))}"]))
    assert settings.expect, f"{experiment} declares no expectations"
    variants = set(base.variants)
    for e in settings.expect:
        named = [*(e.lower or []), *(e.higher or []), *(e.than or []), *(e.in_ or []), *([e.of] if e.of else [])]
        assert set(named) <= variants, f"{experiment}: {e.claim!r} names {set(named) - variants}"
        assert set(e.limiter or []) <= set(VOCABULARY)
        if e.along:
            section, _, rest = e.along.partition(".")
            assert section in ("engine", "workload", "model") and rest, e.along


@pytest.mark.parametrize("experiment", ["quantization", "multi_lora"])
def test_a_lab_on_the_adder_trains_the_model_groups_adder(compose, experiment):
    """The labs that serve the tiny adder on the CPU spell it out (their model replaces the
    default's whole); their spelling is conf/model/tiny_adder.yaml's, so both train and cache
    one adder, never a second one that learned differently."""
    from orchestrator.models.tiny import tiny_dir_name

    adder, _ = to_specs(compose(["model=tiny_adder"]))
    lab, _ = to_specs(compose([f"+experiment={experiment}", "platform=cpu"]))
    assert lab.model.tiny is not None and adder.model.tiny is not None
    assert tiny_dir_name(lab.model.tiny.model_copy(update={"quantization": None})) == tiny_dir_name(adder.model.tiny)


def test_a_trial_asking_more_cpus_than_any_node_has_is_skipped_not_left_waiting(compose):
    """Ray waits forever for a node with the trial's platform.cpus_per_trial: SKIPPED, with why."""
    from orchestrator.feasibility import assess

    spec = to_specs(compose(["platform.cpus_per_trial=64"]))[0]
    assert assess(spec, cluster_gpus=0, node_cpus=2) == (
        "platform.cpus_per_trial 64 is more than any node offers (2 CPUs): Ray would wait for such a node forever"
    )
    assert assess(spec, cluster_gpus=0, node_cpus=None) is None  # a cluster's nodes unknown: not judged
    assert assess(to_specs(compose(["platform.cpus_per_trial=2"]))[0], cluster_gpus=0, node_cpus=2) is None


def test_the_longest_length_vllm_accepts_is_read_as_vllm_reads_it(tmp_path, compose, monkeypatch):
    """models.shape.max_positions: the smallest of a config.json's length keys, or its
    model_max_length where larger (vLLM lets a length up to it through); none with RoPE scaling.
    VLLM_ALLOW_LONG_MAX_MODEL_LEN in the trial's own environment is honoured too."""
    import json

    from orchestrator.config.schema import ModelSpec
    from orchestrator.feasibility import assess
    from orchestrator.models.shape import max_positions

    def positions(cfg: dict) -> int | None:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg))
        found = max_positions(ModelSpec(name="m", source="path", path=str(folder)))
        return found[0] if found else None

    assert positions({"max_position_embeddings": 4096, "max_target_positions": 2048}) == 2048
    assert positions({"max_position_embeddings": 2048, "model_max_length": 8192}) == 8192
    assert positions({"max_position_embeddings": 2048, "rope_scaling": {"type": "yarn", "factor": 4}}) is None
    assert positions({"text_config": {"max_position_embeddings": 1024}}) == 1024
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    assert assess(to_specs(compose(["engine.max_model_len=100000"]))[0], cluster_gpus=0) is None
