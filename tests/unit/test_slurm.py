"""The sbatch script of a sweep: a pure function of its parameters (golden file), strict
about what reaches the shell."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config.errors import ConfigError
from orchestrator.scheduling.slurm import activation, main, params_from, render_sbatch

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "slurm_golden.sbatch"
PARAMS = {
    "job_name": "cp-sweep",
    "nodes": 2,
    "gpus_per_node": 4,
    "cpus_per_node": 32,
    "mem": "256G",
    "time": "08:00:00",
    "partition": "gpu",
    "account": "lab42",
    "workdir": "/work/lab",
    "activate": "source /work/lab/.venv/bin/activate",
    "log_dir": "logs",
}
OVERRIDES = [
    "+experiment=chunked_prefill",
    "platform=gpu",
    "tracking.uri=http://mlflow.internal:5000",
    "workload.classes.main.path=/data/share gpt.json",
]


def test_golden_file():
    script = render_sbatch(params_from(PARAMS), OVERRIDES)
    if os.environ.get("UPDATE_GOLDEN") == "1":  # regenerate on purpose, then review the diff and commit it
        GOLDEN.write_text(script)
    assert GOLDEN.exists(), f"{GOLDEN} is missing: it is the reviewed script, never written by the test itself"
    assert script == GOLDEN.read_text()


def test_script_is_valid_bash_and_quotes_overrides(tmp_path):
    script = render_sbatch(params_from(PARAMS), OVERRIDES)
    path = tmp_path / "s.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    assert "'workload.classes.main.path=/data/share gpt.json'" in script
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=4" in script
    assert "#SBATCH --partition=gpu" in script and "#SBATCH --account=lab42" in script
    assert 'cluster.address="$address" -m' in script


def test_unknown_parameter_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown parameter.*gpu_per_node.*valid: job_name, nodes, gpus_per_node"):
        params_from({"gpu_per_node": 4})


@pytest.mark.parametrize("bad", [{"partition": "gpu; rm -rf /"}, {"time": "8h"}, {"account": "$(id)"}, {"nodes": 0}])
def test_unsafe_or_bad_values_are_rejected(bad):
    with pytest.raises(ConfigError, match="slurm: "):
        params_from(bad)


def test_overrides_may_not_set_what_the_script_sets():
    with pytest.raises(ConfigError, match="may not contain -m"):
        render_sbatch(params_from({}), ["+experiment=x", "-m"])


def test_cli_prints_and_rejects(capsys):
    assert main(["--nodes", "1", "--gpus-per-node", "0", "+experiment=first_serving"]) == 0
    out = capsys.readouterr().out
    assert (
        "--gpus-per-node" not in out.split("set -euo")[0]
        and "orchestrator +experiment=first_serving cluster.address" in out
    )
    assert main(["--time", "soon", "+experiment=x"]) == 2
    assert "slurm: --time: expected HH:MM:SS or D-HH:MM:SS (got 'soon')" in capsys.readouterr().err
    assert main(["--mem", "bar", "+experiment=x"]) == 2  # it was written into the script as it was
    assert (
        "slurm: --mem: expected a size as sbatch takes it, such as 64G or 512000M (got 'bar')"
        in capsys.readouterr().err
    )


def test_ray_port_must_avoid_rays_own_ranges():
    # Found on a real SLURM: --port 16380 collides with Ray's worker ports (10002-19999).
    with pytest.raises(ConfigError, match="--ray-port: 16380 collides with Ray"):
        params_from({"ray_port": 16380})


def test_ray_job_entrypoint_quotes_every_part_and_adds_the_cluster():
    from orchestrator.scheduling.submit import entrypoint, runtime_env

    cmd = entrypoint(["+experiment=chunked_prefill", "workload.classes.main.path=/data/a b.json; rm -rf /"])
    assert cmd == (
        "python -m orchestrator +experiment=chunked_prefill "
        "'workload.classes.main.path=/data/a b.json; rm -rf /' cluster.address=auto -m"
    )
    with pytest.raises(ConfigError, match="cluster.address"):
        entrypoint(["cluster.address=ray://x:10001"])
    env = runtime_env(upload=True)
    assert env["working_dir"] == str(Path(__file__).resolve().parents[2])  # the project, uploaded to the cluster
    assert ".venv/" in env["excludes"] and "mlflow.db" in env["excludes"]
    assert runtime_env(upload=False) == {}


def test_cpus_per_node_let_every_gpu_run_a_trial():
    """A GPU trial reserves platform.cpus_per_trial CPUs (4 on platform=gpu): four GPUs need 16
    CPUs on the node, or only two of them run a trial at a time (the old fixed 8)."""
    gpu = ["+experiment=gpu_smoke", "platform=gpu"]
    script = render_sbatch(params_from({"gpus_per_node": 4}), gpu)
    assert "#SBATCH --cpus-per-task=16" in script and script.count("--num-cpus=16 --num-gpus=4") == 2
    two = render_sbatch(params_from({"gpus_per_node": 4}), [*gpu, "platform.cpus_per_trial=2"])
    assert "#SBATCH --cpus-per-task=8" in two
    assert "--cpus-per-task=8" in render_sbatch(params_from({"gpus_per_node": 0}), ["+experiment=first_serving"])
    assert "--cpus-per-task=40" in render_sbatch(params_from({"gpus_per_node": 4, "cpus_per_node": 40}), gpu)
    with pytest.raises(ConfigError, match="platform=tpu"):
        render_sbatch(params_from({"gpus_per_node": 1}), ["platform=tpu"])
    # a fraction of a CPU (the schema allows 1.5) takes a whole one of the node's: it was a traceback
    assert "#SBATCH --cpus-per-task=8" in render_sbatch(
        params_from({"gpus_per_node": 4}), [*gpu, "platform.cpus_per_trial=1.5"]
    )
    with pytest.raises(ConfigError, match="platform.cpus_per_trial: expected a number, got 'abc'"):
        render_sbatch(params_from({"gpus_per_node": 1}), ["platform.cpus_per_trial=abc"])


def test_submit_validates_the_sweep_here_before_sbatch(tmp_path, capsys):
    """A typo fails now, naming the key, not after the job waited in the queue; nothing is submitted."""
    rc = main(["--submit", "--log-dir", str(tmp_path), "--", "+experiment=first_serving", "workload.num_requestz=4"])
    err = capsys.readouterr().err
    assert rc == 2 and "nothing was submitted" in err and "num_requestz" in err


def test_by_default_the_script_runs_in_the_environment_it_was_rendered_from(tmp_path):
    """Issue 58: without --activate the compute nodes ran whatever python and ray their PATH found."""
    venv_bin = tmp_path / "my env" / "bin"
    line = activation(None, str(venv_bin / "python"))
    assert f"export PATH='{venv_bin}':\"$PATH\"" in line
    script = render_sbatch(params_from({k: v for k, v in PARAMS.items() if k != "activate"}), OVERRIDES)
    assert "(no environment activation" not in script
    here = os.path.dirname(os.path.abspath(sys.executable))
    assert "export PATH=" in script and here in script
    path = tmp_path / "s.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    # the rendered line, run by bash, puts that folder first
    probe = subprocess.run(["bash", "-c", f"{line}\necho $PATH"], capture_output=True, text=True, check=True)
    assert probe.stdout.startswith(f"{venv_bin}:")
    assert activation("source /x/bin/activate") == "source /x/bin/activate"  # --activate overrides
    assert activation("none").startswith("# (no environment activation")
