"""The command line fails fast, before any server starts, naming the bad key."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_typo_in_existing_group_is_rejected_by_hydra():
    """Hydra's own refusals exit 2, as the orchestrator's config errors do (a script tells bad
    input from a failed trial by it); they exited 1."""
    p = run("+experiment=chunked_prefill", "engine.max_num_batched_tokenz=5")
    assert p.returncode == 2, p.stderr
    assert "max_num_batched_tokenz" in p.stderr
    assert "starting vllm" not in p.stdout
    p = run("model=no_such_model", "dry_run=true", "-m")
    assert p.returncode == 2 and "no_such_model" in p.stderr


def test_added_unknown_key_is_rejected_with_allowed_keys():
    p = run("+experiment=chunked_prefill", "+engine.max_num_batched_tokenz=5", "-m")
    assert p.returncode == 2, p.stderr
    assert "engine.max_num_batched_tokenz: unknown key" in p.stderr
    assert "max_num_batched_tokens" in p.stderr
    assert "starting vllm" not in p.stdout


def test_unknown_experiment():
    p = run("+experiment=no_such_lab")
    assert p.returncode == 2
    assert "no_such_lab" in p.stderr


def test_dry_run_prints_one_line_per_trial_and_starts_nothing():
    import json

    p = run("+experiment=chunked_prefill", "dry_run=json", "-m")
    assert p.returncode == 0, p.stderr
    lines = [
        x for x in map(json.loads, filter(lambda s: s.startswith("{"), p.stdout.splitlines())) if "trial_hash" in x
    ]
    assert [x["variant"] for x in lines] == ["chunking_off", "budget_256", "budget_512", "budget_2048"]
    assert all(x["feasible"] and x["servers"][0]["argv"][0].endswith("python") for x in lines)
    assert "--no-enable-chunked-prefill" in lines[0]["servers"][0]["argv"]


def test_overrides_on_both_sides_of_multirun_flag():
    import json

    p = run("+experiment=chunked_prefill", "-m", "engine.block_size=32", "dry_run=json")
    assert p.returncode == 0, p.stderr
    lines = [
        x for x in map(json.loads, filter(lambda s: s.startswith("{"), p.stdout.splitlines())) if "trial_hash" in x
    ]
    assert len(lines) == 4
    assert all(x["servers"][0]["argv"][x["servers"][0]["argv"].index("--block-size") + 1] == "32" for x in lines)


def test_flags_last_keeps_everything_else_in_order():
    from orchestrator.__main__ import flags_last

    assert flags_last(["a=1", "-m", "b=2", "--cfg", "job"]) == ["a=1", "b=2", "--cfg", "job", "-m"]
    assert flags_last(["a=1"]) == ["a=1"]


def test_missing_dataset_file_fails_before_launch():
    p = run("workload=sharegpt", "workload.classes.main.path=/nope/sharegpt.json", "-m")
    assert p.returncode == 2, p.stderr
    assert "sharegpt dataset: file '/nope/sharegpt.json' does not exist" in p.stderr
    assert "starting vllm" not in p.stdout


def test_dry_run_of_a_gpu_lab_shows_every_server_and_skips_on_cpu():
    import json

    p = run("+experiment=disaggregated_pd", "platform=gpu", "dry_run=json", "-m")
    assert p.returncode == 0, p.stderr
    lines = [
        x for x in map(json.loads, filter(lambda s: s.startswith("{"), p.stdout.splitlines())) if "trial_hash" in x
    ]
    pd = next(x for x in lines if x["variant"] == "pd_vllm_in1024")
    assert (
        pd["status"] in ("feasible", "blocked")
        and pd["feasible"]
        and pd["gpus"] == 2
        and pd["kv_capacity_tokens"] > 100_000
    )
    names = [s["name"] for s in pd["servers"]]
    assert names == ["prefill", "decode", "proxy"]
    assert [s["gpu_slots"] for s in pd["servers"]] == [[0], [1], []]
    assert "--kv-transfer-config" in pd["servers"][0]["argv"]
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" in pd["servers"][1]["env"]
    p = run("+experiment=disaggregated_pd", "dry_run=json", "-m")  # the CPU platform
    lines = [
        x for x in map(json.loads, filter(lambda s: s.startswith("{"), p.stdout.splitlines())) if "trial_hash" in x
    ]
    status = {x["variant"]: (x["status"], x["reason"]) for x in lines}
    # P/D through the ExampleConnector and its one-server baseline run; NIXL and SGLang say why not
    assert status["pd_cpu_in1000"] == ("feasible", None) and status["standard_in1000"] == ("feasible", None)
    assert status["pd_vllm_in128"][0] == "skipped" and "ExampleConnector" in status["pd_vllm_in128"][1]
    assert status["pd_sglang_in1024"][0] == "skipped" and "CUDA" in status["pd_sglang_in1024"][1]


def test_dry_run_ends_with_a_plan_of_the_whole_sweep():
    import json

    p = run("+experiment=tensor_parallel", "platform=gpu", "cluster.num_gpus=4", "dry_run=json", "-m")
    assert p.returncode == 0, p.stderr
    plan = [json.loads(x)["plan"] for x in p.stdout.splitlines() if x.startswith('{"plan"')]
    assert len(plan) == 1
    plan = plan[0]
    # feasible here, or blocked until the GPU engine environment is made (make engines-gpu)
    assert plan["trials"] == 3 and plan["feasible"] + plan["blocked"] == 3 and plan["gpus_per_trial"] == [1, 2, 4]
    assert plan["estimated_s"] > 0 and plan["gpu_hours"] > 0
    assert plan["estimated_s"] <= plan["estimated_serial_s"]
    p = run("+experiment=tensor_parallel", "platform=gpu", "cluster.num_gpus=2", "dry_run=json", "-m")
    plan = [json.loads(x)["plan"] for x in p.stdout.splitlines() if x.startswith('{"plan"')][0]
    assert plan["skipped"] == 1  # TP 4 on a 2-GPU cluster


def test_plan_counts_shared_server_starts():
    import json

    def plan_of(*args):
        p = run(*args, "dry_run=json", "-m")
        assert p.returncode == 0, p.stderr
        return [json.loads(x)["plan"] for x in p.stdout.splitlines() if x.startswith('{"plan"')][0]

    # 2 workloads x 2 block sizes: 4 trials, 2 server configurations
    plan = plan_of("workload=short_short,long_short", "engine.block_size=32,64")
    assert plan["trials"] == 4 and plan["server_starts"] == 2
    assert plan_of("workload=short_short,long_short")["server_starts"] == 1
    assert plan_of("workload=short_short,long_short", "reuse_servers=false")["server_starts"] == 2


def test_a_gpu_dry_run_is_a_table_that_says_what_it_assumed():
    """dry_run=true on a machine without GPUs: per trial its GPUs and their model, weights
    against the GPU's memory, the KV capacity in tokens and requests, the load points, the time;
    BLOCKED with the command that makes a missing engine environment; how many GPUs it assumed
    and why. The JSON lines stay behind dry_run=json."""
    p = run("+experiment=gpu_smoke", "platform=gpu", "platform.engine_envs=/nonexistent/engines", "dry_run=true", "-m")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert not any(line.startswith("{") for line in out.splitlines())
    head = next(line for line in out.splitlines() if line.startswith("trial "))
    for column in ("status", "GPUs", "weights / GPU", "KV capacity", "load points", "est.", "reason"):
        assert column in head, head
    tp1 = next(line for line in out.splitlines() if line.startswith("vllm_tp1 "))
    assert "BLOCKED" in tp1 and "1 x A100-80GB" in tp1 and "of 80 GB" in tp1 and "tokens (" in tp1, tp1
    assert "make engines-gpu" in tp1
    assert "GPUs assumed: unknown: no GPU readable here" in out and "planned as if its GPUs exist" in out
    assert "Plan: 6 trial(s): 0 feasible, 6 blocked, 0 skipped" in out, out[-600:]


def test_help_shows_the_projects_usage_before_hydras_groups():
    p = run("--help")
    assert p.returncode == 0, p.stderr
    usage, groups = p.stdout.index("== Usage =="), p.stdout.index("== Configuration groups ==")
    assert usage < groups and "+experiment=chunked_prefill -m" in p.stdout and "dry_run=true" in p.stdout


def test_secrets_on_the_command_line_are_hidden_in_the_files_hydra_writes(tmp_path):
    """Hydra saves the command's config and overrides (multirun.yaml; .hydra/ of a single run)
    before the orchestrator runs: a token given on the command line, or a tracking URI's password,
    must not stay there in plain text."""
    secrets = ["+engine.env.HF_TOKEN=hfsecretvalue123", "tracking.uri=https://bob:pw12345@mlflow.example:5000"]
    common = [*secrets, "tracking.enabled=false", "dry_run=true"]
    multi = run("+experiment=chunked_prefill", *common, f"hydra.sweep.dir={tmp_path / 'multi'}", "-m")
    single = run(*common, f"hydra.run.dir={tmp_path / 'single'}")
    assert multi.returncode == 0 and single.returncode == 0, multi.stderr + single.stderr
    written = {p.relative_to(tmp_path).as_posix(): p.read_text() for p in tmp_path.rglob("*.yaml")}
    assert {"multi/multirun.yaml", "single/.hydra/config.yaml", "single/.hydra/overrides.yaml"} <= set(written)
    for name, text in [*written.items(), ("output", multi.stdout + multi.stderr + single.stdout + single.stderr)]:
        assert "hfsecretvalue123" not in text and "pw12345" not in text, name
    assert (
        "HF_TOKEN: '***'" in written["single/.hydra/config.yaml"]
        or "HF_TOKEN: ***" in written["single/.hydra/config.yaml"]
    )
    assert "https://bob:***@mlflow.example:5000" in written["multi/multirun.yaml"]


def test_a_misspelt_knob_or_a_point_no_trial_has_fails_before_the_sweep():
    """The verdict's knob and its load point are checked against the sweep's trials: a typo left
    the verdict empty after the whole sweep ran."""
    p = run("+experiment=chunked_prefill", "objective.minimize=engine.max_num_batched_tokenz", "dry_run=true", "-m")
    assert p.returncode == 2
    assert "objective.minimize: engine.max_num_batched_tokenz is no key of a trial's config" in p.stderr
    assert "closest: engine.max_num_batched_tokens" in p.stderr
    p = run("+experiment=chunked_prefill", "~objective", "+objective={maximize:goodput,at:c999}", "dry_run=true", "-m")
    assert p.returncode == 2
    assert "objective.at: no load point 'c999' in this sweep (its points: c2, c4)" in p.stderr


def test_an_experiment_without_m_says_it_is_a_sweep():
    p = run("+experiment=chunked_prefill", "dry_run=true")
    assert p.returncode == 0, p.stderr
    assert "note: experiment 'chunked_prefill' is a sweep of 6 variants" in p.stderr and "add -m to run it" in p.stderr
    assert "note: experiment" not in run("+experiment=chunked_prefill", "variant=budget_256", "dry_run=true").stderr


def test_a_secret_is_hidden_in_hydras_files_even_when_the_command_fails(tmp_path):
    """A config that does not resolve ends the command after Hydra wrote its files: the secret
    given with it was left there in plain text."""
    bad = ["+engine.env.HF_TOKEN=plainsecret99", "workload.num_requests=${nope}"]
    multi = run(*bad, f"hydra.sweep.dir={tmp_path / 'multi'}", "-m")
    single = run(*bad, f"hydra.run.dir={tmp_path / 'single'}")
    assert multi.returncode != 0 and single.returncode != 0
    written = list(tmp_path.rglob("*.yaml"))
    assert written and all("plainsecret99" not in p.read_text() for p in written), written


def test_a_groups_shared_part_is_no_choice(tmp_path):
    """``workload=_common`` (the keys every workload file shares) said only that workload.name was
    missing: it is named as no choice, with the group's real options, in both modes."""
    for mode in ([f"hydra.sweep.dir={tmp_path / 'multi'}", "-m"], [f"hydra.run.dir={tmp_path / 'single'}"]):
        p = run("workload=_common", "dry_run=true", *mode)
        assert p.returncode == 2, p.stderr
        assert "workload=_common: a file whose name begins with '_'" in p.stderr, p.stderr
        assert "Choose one of: long_short, " in p.stderr and "_common," not in p.stderr
        assert "required key is missing" not in p.stderr


def test_a_driver_started_with_sigint_ignored_honors_ctrl_c_from_the_start() -> None:
    """A background job of a non-interactive shell starts the driver with SIGINT ignored: the CLI
    restores Ctrl-C before anything else (a handler the caller set is left alone)."""
    import signal

    from orchestrator.__main__ import honor_ctrl_c

    before = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        honor_ctrl_c()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

        def mine(signum: int, frame: object) -> None:
            pass

        signal.signal(signal.SIGINT, mine)
        honor_ctrl_c()
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, before)
