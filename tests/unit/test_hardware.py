"""The hardware as it is: NVML names mapped to the GPU table, a configured GPU that is not the
node's refused before anything starts, roofs measured (torch; here on the CPU) and cached per
node, the roofline's roofs and where they came from, and the GPU self-check's table."""

from __future__ import annotations

import pytest

from orchestrator import feasibility, gpu_check
from orchestrator.config import ConfigError, to_specs
from orchestrator.perf import floors, gpus
from orchestrator.perf import roofs as roofs_mod
from orchestrator.perf.gpus import DetectedGPU, table_name
from orchestrator.perf.roofs import Roofs, cached_roofs, calibrate, measure_roofs
from orchestrator.trial import machine


@pytest.mark.parametrize(
    "nvml, gb, key",
    [
        ("NVIDIA H100 80GB HBM3", 85.0, "H100-SXM-80GB"),  # what the lent H100 reported
        ("NVIDIA H100 PCIe", 85.0, "H100-PCIe-80GB"),
        ("NVIDIA H100 NVL", 100.0, None),
        ("NVIDIA H200", 150.7, "H200-141GB"),
        ("NVIDIA A100-SXM4-80GB", 85.1, "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", 42.5, "A100-40GB"),
        ("NVIDIA L40S", 48.3, "L40S-48GB"),
        ("NVIDIA L4", 24.1, "L4-24GB"),
        ("NVIDIA A10G", 24.1, "A10G-24GB"),
        ("NVIDIA GeForce RTX 4090", 25.4, None),
    ],
)
def test_nvml_names_map_to_the_gpu_table(nvml, gb, key):
    assert table_name(nvml, gb) == key


H100 = DetectedGPU(0, "NVIDIA H100 80GB HBM3", "GPU-1234", 85.5, "9.0", "580.159.04")


@pytest.fixture
def on_an_h100(monkeypatch, tmp_path):
    monkeypatch.setattr(gpus, "node_gpus", lambda devices=None: ((H100,), None))
    monkeypatch.setattr(roofs_mod, "CACHE_DIR", tmp_path)
    return tmp_path


def test_a_configured_gpu_that_is_not_the_nodes_is_an_error_before_anything_starts(compose, on_an_h100):
    from orchestrator.scheduling import prepare_jobs

    over = ["platform=gpu", "platform.gpu_name=A100-80GB", "dry_run=true"]
    with pytest.raises(ConfigError, match=r"platform.gpu_name is A100-80GB but GPU 0 here is NVIDIA H100 80GB HBM3"):
        prepare_jobs([(over, compose(over))])
    jobs = prepare_jobs([(over, compose([*over, "platform.gpu_name_check=warn"]))])  # planned as configured
    assert gpus.gpu_model(jobs[0].spec).name == "A100-80GB"


def test_auto_plans_for_the_detected_gpu_and_its_calibrated_roofs(compose, on_an_h100):
    spec, _ = to_specs(compose(["platform=gpu"]))
    assert spec.platform.gpu_name == "auto"
    model = gpus.gpu_model(spec)
    assert (model.name, model.memory_gb) == ("H100-SXM-80GB", 85.5) and "detected here" in model.source
    roof = floors.roofs_used(spec)
    assert (roof.bandwidth_gb_s, roof.peak_tflops) == (3350, 989) and roof.source.startswith("GPU table")
    measured = Roofs("H100-SXM-80GB", 3023.0, 795.0, 1500.0, 0.0, "a test")
    calibrate("H100-SXM-80GB", lambda: measured)
    roof = floors.roofs_used(spec)
    assert (roof.bandwidth_gb_s, roof.peak_tflops) == (3023.0, 795.0)
    assert roof.source.startswith("measured on this node") and "table: 3350 GB/s" in roof.source
    table, _ = to_specs(compose(["platform=gpu", "platform.roofs=table"]))
    assert floors.roofs_used(table).bandwidth_gb_s == 3350
    plan = feasibility.describe(spec)
    assert plan["gpu_model"] == "H100-SXM-80GB" and plan["roofs"].startswith("3023 GB/s, 795 TFLOP/s: measured")


def test_the_dry_run_names_the_detected_gpu_and_the_roofs_it_will_use(compose, on_an_h100):
    from orchestrator.scheduling import prepare_jobs
    from orchestrator.scheduling.preview import dry_run

    calibrate("H100-SXM-80GB", lambda: Roofs("H100-SXM-80GB", 3023.0, 795.0, 1500.0, 0.0, "a test"))
    over = ["platform=gpu", "dry_run=true"]
    lines: list[str] = []
    dry_run(prepare_jobs([(over, compose(over))]), lines.append)
    said = next(line for line in lines if line.startswith("GPUs assumed:"))
    assert "GPU model: detected here: NVIDIA H100 80GB HBM3;" in said, said
    assert "roofline roofs: 3023 GB/s, 795 TFLOP/s: measured on this node" in said, said
    assert "1 x H100-SXM-80GB" in "\n".join(lines)  # each trial's row names the table's GPU


def test_no_gpu_here_plans_for_the_courses_gpu_and_says_so(compose, monkeypatch):
    monkeypatch.setattr(gpus, "node_gpus", lambda devices=None: ((), "no GPU detected: NVML unavailable"))
    spec, _ = to_specs(compose(["platform=gpu"]))
    model = gpus.gpu_model(spec)
    assert model.name == "A100-80GB" and model.source == "no GPU detected: NVML unavailable; planned for A100-80GB"
    assert gpus.gpu_mismatch(spec) is None


def test_roofs_are_measured_with_torch_and_cached_per_node(tmp_path):
    roofs = measure_roofs("cpu", copy_mib=8, n=128, rounds=2)
    assert roofs.device == "cpu" and roofs.bandwidth_gb_s > 0.1 and roofs.bf16_tflops > 0 and roofs.fp8_tflops is None
    calls = []

    def measure() -> Roofs:
        calls.append(1)
        return roofs

    assert calibrate("cpu", measure, tmp_path) == (roofs, True)
    assert calibrate("cpu", measure, tmp_path) == (roofs, False) and len(calls) == 1  # the cache
    assert calibrate("cpu", measure, tmp_path, again=True)[1] and len(calls) == 2
    assert cached_roofs("cpu", tmp_path) == roofs and cached_roofs("H200-141GB", tmp_path) is None


def test_the_slate_leaves_out_this_process_and_says_what_it_cannot_see():
    import os

    assert os.getpid() in machine.own_processes()
    assert machine.unseen_note([]) is None
    assert machine.unseen_note([2.0, None]) == (
        "NVML lists 2 compute process(es) this process cannot see (another pid namespace, e.g. a container), "
        "holding 2.00 GB: judged by each GPU's memory in use only"
    )


def test_the_gpu_check_ends_in_a_table_whatever_a_check_does(monkeypatch, capsys):
    def broken() -> tuple[str, str]:
        raise RuntimeError("no driver")

    monkeypatch.setattr(gpu_check, "CHECKS", [("fine", lambda: ("PASS", "ok")), ("broken", broken)])
    assert gpu_check.main([]) == 1
    out = capsys.readouterr().out
    assert "| fine | PASS | ok |" in out and "| broken | FAIL | RuntimeError: no driver |" in out
    assert out.rstrip().endswith("gpu-check: FAILED: broken")


def test_a_gpu_trial_whose_gpu_names_cannot_be_read_is_not_called_a_cpu_host(monkeypatch):
    """The MLflow 'hardware' tag of a GPU trial read 'cpu:...' when NVML failed to name its GPUs."""
    from orchestrator.metrics import host as host

    monkeypatch.setattr(host, "gpu_names", lambda indices: [])
    assert host.describe([0, 1])["summary"] == "2x GPU (name unreadable: NVML failed)"
    assert host.describe([])["summary"].startswith("cpu:")
    monkeypatch.setattr(host, "gpu_names", lambda indices: ["NVIDIA H100 80GB HBM3"] * len(indices))
    assert host.describe([0, 1])["summary"] == "2x NVIDIA H100 80GB HBM3"
