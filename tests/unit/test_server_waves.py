"""Which of a trial's servers start together: engines at once unless they share a GPU, a router
or proxy after the engines it fronts are healthy."""

from __future__ import annotations

from orchestrator.config import to_specs
from orchestrator.engines import LaunchContext, ServerLaunch, adapter_for
from orchestrator.trial.servers import start_waves


def _launches(spec):
    return adapter_for(spec.engine.name).launches(
        spec, LaunchContext("/m", 8000, iter(range(9000, 9100)).__next__, "/t")
    )


def _names(waves):
    return [[x.name for x in wave] for wave in waves]


def test_replicas_start_together_and_the_router_after_them(compose):
    spec, _ = to_specs(compose(["+experiment=scheduling_policies", "variant=dp2_cache_aware"]))
    assert _names(start_waves(_launches(spec), [])) == [["replica0", "replica1"], ["router"]]


def test_pd_on_separate_gpus_starts_together_the_proxy_after(compose):
    spec, _ = to_specs(
        compose(["platform=gpu", "engine.disaggregation={connector:NixlConnector,prefill_tp:2,decode_tp:1}"])
    )
    launches = _launches(spec)
    assert _names(start_waves(launches, [4, 5, 6])) == [["prefill", "decode"], ["proxy"]]


def test_engines_sharing_a_gpu_start_one_after_the_other():
    def launch(name, gpus, role="replica"):
        return ServerLaunch(name, ["x"], {}, "127.0.0.1", 1, gpus=gpus, role=role)

    a, b, c, r = launch("a", (0,)), launch("b", (0,)), launch("c", (1,)), launch("r", (), "router")
    assert _names(start_waves([a, b, c, r], [7, 8])) == [["a"], ["b", "c"], ["r"]]
    # None means all of the trial's GPUs: it shares with anything that has one
    assert _names(start_waves([launch("x", None), launch("y", (1,))], [7, 8])) == [["x"], ["y"]]
    # on the CPU (no GPUs) every engine starts at once
    assert _names(start_waves([launch("x", None), launch("y", None)], [])) == [["x", "y"]]
