"""The SGLang router (PyPI ``sglang-router``) in front of a trial's servers: vLLM replicas
(cache-aware routing) or SGLang's prefill and decode servers (``--pd-disaggregation``)."""

from __future__ import annotations

from orchestrator.config.schema import TrialSpec
from orchestrator.engines import envs
from orchestrator.engines.base import ServerLaunch

ROUTER_MODULE = "sglang_router.launch_router"


def router_launch(
    spec: TrialSpec, host: str, port: int, metrics_port: int, routing: list[str], extra_args: tuple[str, ...] = ()
) -> ServerLaunch:
    """The router on ``host:port`` with ``routing`` (its backends and policy) and its Prometheus
    listener on ``metrics_port`` (0.0.0.0:29000 unless told: one per trial, on our host). It is
    measured at the front; its own metrics are not scraped (``metrics_path=""``)."""
    return ServerLaunch(
        name="router",
        role="router",
        port=port,
        env={},
        host=host,
        startup_timeout_s=120.0,
        gpus=(),
        metrics_path="",
        argv=[
            *envs.helper_command(spec, ROUTER_MODULE, envs.ROUTER_ENVIRONMENT),
            *routing,
            "--host",
            host,
            "--port",
            str(port),
            "--prometheus-host",
            host,
            "--prometheus-port",
            str(metrics_port),
            *extra_args,
        ],
    )
