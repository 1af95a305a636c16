"""Which interpreter runs each server: the engine's own environment on GPUs, this one on the
CPU, engine.python or a container prefix when configured; a missing environment is a clear
error before anything starts (a dry run only reports it)."""

from __future__ import annotations

import json
import sys

import pytest

from orchestrator.config import to_specs
from orchestrator.config.errors import ConfigError
from orchestrator.engines import LaunchContext, adapter_for, envs
from orchestrator.engines.verify import checks_for
from orchestrator.scheduling.jobs import prepare_jobs


def _launches(spec):
    return adapter_for(spec.engine.name).launches(
        spec, LaunchContext("/m", 8000, iter(range(9000, 9100)).__next__, "/t")
    )


def test_cpu_uses_this_interpreter(compose):
    spec, _ = to_specs(compose([]))
    assert envs.environment(spec) is None and envs.missing(spec) is None
    (launch,) = _launches(spec)
    assert launch.argv[:3] == [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry"]


@pytest.mark.parametrize("engine,env_name", [("vllm", "vllm-gpu"), ("sglang", "sglang-gpu")])
def test_gpu_uses_the_engine_environment(compose, tmp_path, engine, env_name):
    spec, _ = to_specs(compose(["platform=gpu", f"engine={engine}", f"platform.engine_envs={tmp_path}"]))
    python = str(tmp_path / env_name / "bin" / "python")
    for launch in _launches(spec):
        assert launch.argv[0] == python
    assert "make engines-gpu" in (envs.missing(spec) or "")
    (tmp_path / env_name / "bin").mkdir(parents=True)
    (tmp_path / env_name / "bin" / "python").touch()
    assert envs.missing(spec) is None


def test_the_environment_folder_comes_from_the_environment_variable(compose, tmp_path, monkeypatch):
    monkeypatch.setenv(envs.ENV_VAR, str(tmp_path))
    spec, _ = to_specs(compose(["platform=gpu"]))
    assert envs.interpreter(spec) == str(tmp_path / "vllm-gpu" / "bin" / "python")


def test_our_proxy_runs_here_and_the_router_in_sglangs_environment(compose, tmp_path):
    spec, _ = to_specs(
        compose(["platform=gpu", f"platform.engine_envs={tmp_path}", "engine.disaggregation={connector:NixlConnector}"])
    )
    prefill, decode, proxy = _launches(spec)
    assert prefill.argv[0] == decode.argv[0] == str(tmp_path / "vllm-gpu" / "bin" / "python")
    assert proxy.argv[0] == sys.executable  # orchestrator code: never the engine's interpreter
    assert checks_for(proxy) == []
    spec, _ = to_specs(
        compose(
            [
                "platform=gpu",
                "engine=sglang",
                f"platform.engine_envs={tmp_path}",
                "engine.disaggregation={connector:mooncake}",
            ]
        )
    )
    *servers, router = _launches(spec)
    assert router.argv[:3] == [str(tmp_path / "sglang-gpu" / "bin" / "python"), "-m", "sglang_router.launch_router"]
    assert [c.kind for c in checks_for(router)] == ["router"]


def test_launch_prefix_runs_the_server_inside_a_container(compose):
    spec, _ = to_specs(compose(["platform=gpu", "engine.launch_prefix=[apptainer,exec,--nv,/shared/vllm.sif]"]))
    (launch,) = _launches(spec)
    assert launch.argv[:7] == [
        "apptainer",
        "exec",
        "--nv",
        "/shared/vllm.sif",
        "python3",
        "-m",
        "vllm.entrypoints.launchers.api_server.entry",
    ]
    assert envs.missing(spec) is None  # the container's python is not looked for on this host
    (check,) = checks_for(launch)
    assert check.python == "python3" and check.payload["argv"][:2] == ["--model", "/m"]
    spec, _ = to_specs(
        compose(
            [
                "platform=gpu",
                'engine.launch_prefix=[srun,"--container-image=img"]',
                "engine.python=/opt/venv/bin/python",
            ]
        )
    )
    assert _launches(spec)[0].argv[:3] == ["srun", "--container-image=img", "/opt/venv/bin/python"]


def test_engine_python_overrides_and_must_exist(compose, tmp_path):
    spec, _ = to_specs(compose(["platform=gpu", f"engine.python={tmp_path}/nope/python"]))
    assert _launches(spec)[0].argv[0] == f"{tmp_path}/nope/python"
    assert "engine.python" in envs.missing(spec)
    spec, _ = to_specs(compose(["platform=gpu", "engine.python=python3"]))  # a name on PATH: not checked here
    assert envs.missing(spec) is None


def test_missing_environment_fails_the_sweep_before_launch_but_not_its_dry_run(compose, tmp_path):
    cfg = compose(["platform=gpu", f"platform.engine_envs={tmp_path}"])
    with pytest.raises(ConfigError, match=r"vllm engine environment is missing.*make engines-gpu"):
        prepare_jobs([([], cfg)])
    from orchestrator.scheduling.preview import dry_run

    jobs = prepare_jobs([([], compose(["platform=gpu", f"platform.engine_envs={tmp_path}", "dry_run=json"]))])
    lines = []
    dry_run(jobs, lines.append)
    plan = json.loads(lines[0])
    assert "make engines-gpu" in plan["engine_environment"]
    assert plan["servers"][0]["argv"][0] == str(tmp_path / "vllm-gpu" / "bin" / "python")


def test_trial_hash_ignores_where_the_engine_comes_from(compose, tmp_path):
    from orchestrator.config import trial_hash

    a, _ = to_specs(compose(["platform=gpu"]))
    b, _ = to_specs(
        compose(
            ["platform=gpu", f"platform.engine_envs={tmp_path}", "engine.launch_prefix=[apptainer,exec,--nv,x.sif]"]
        )
    )
    assert trial_hash(a) == trial_hash(b)


def test_status_table_says_what_worked():
    from orchestrator.metrics.result import PointResult, TrialResult
    from orchestrator.scheduling.sweep_report import status_table

    ok = TrialResult(
        trial_hash="a" * 16,
        experiment="gpu_smoke",
        variant="vllm_tp1",
        overrides=[],
        spec={},
        status="FINISHED",
        started_at=0,
        ended_at=1,
        engine_version="vllm==0.32.0",
        points=[
            PointResult(
                index=0,
                label="c4",
                setting={"concurrency": 4},
                metrics={"tokens_per_second": 812.0, "ttft_ms_p50": 31.0},
            )
        ],
    )
    skipped = TrialResult(
        trial_hash="b" * 16,
        experiment="gpu_smoke",
        variant="vllm_tp2",
        overrides=[],
        spec={},
        status="SKIPPED",
        error="needs 2 GPU(s) but the cluster has 1",
        started_at=0,
        ended_at=0,
    )
    lines = status_table([skipped, ok])
    assert lines[0].split("|")[0].strip() == "trial"
    assert "vllm_tp1" in lines[2] and "FINISHED" in lines[2] and "812 tok/s" in lines[2]
    assert "vllm_tp2" in lines[3] and "SKIPPED" in lines[3] and "needs 2 GPU(s)" in lines[3]


def test_a_prefix_with_its_own_dash_m_is_not_mistaken_for_the_module(compose):
    spec, _ = to_specs(compose(["platform=gpu", "engine.launch_prefix=[srun,-m,block,--overlap]"]))
    (launch,) = _launches(spec)
    (check,) = checks_for(launch)
    assert check.kind == "vllm" and check.payload["argv"][:2] == ["--model", "/m"]


def test_one_rule_for_routers_in_front_of_either_engine(compose, tmp_path):
    """A router runs like the engine's servers when its package is in the engine's environment
    (SGLang's P/D router: behind SGLang's launch prefix too), else in its own environment and
    never behind the engine's prefix (vLLM's container has no sglang-router)."""
    prefix = "engine.launch_prefix=[apptainer,exec,--nv,x.sif]"
    spec, _ = to_specs(
        compose(
            [
                "platform=gpu",
                "engine=sglang",
                f"platform.engine_envs={tmp_path}",
                prefix,
                "engine.disaggregation={connector:mooncake}",
            ]
        )
    )
    *_, router = _launches(spec)
    assert router.argv[:6] == ["apptainer", "exec", "--nv", "x.sif", "python3", "-m"]
    spec, _ = to_specs(
        compose(["platform=gpu", f"platform.engine_envs={tmp_path}", prefix, "engine.router={replicas:2}"])
    )
    *replicas, router = _launches(spec)
    assert replicas[0].argv[:4] == ["apptainer", "exec", "--nv", "x.sif"]
    assert router.argv[:2] == [str(tmp_path / "sglang-gpu" / "bin" / "python"), "-m"]
    spec, _ = to_specs(compose([f"platform.engine_envs={tmp_path}", "engine.router={replicas:2}"]))  # CPU
    assert _launches(spec)[-1].argv[0] == sys.executable
