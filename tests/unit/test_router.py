"""The SGLang router (PyPI sglang-router: the real binary from .venv) in front of two fake
servers, launched as a trial launches it in front of vLLM replicas (``engines.router.router_launch``
through the product's server process): round robin spreads the requests over both replicas,
cache-aware routing keeps each prefix group on one (sent one at a time, no replica is busier than
the other, so the router balances nothing and every group may share the first one). CI's check of the
router's wiring; the routing of real replicas and its effect on their prefix caches is
``integration/test_cpu_gpu_paths.py::test_cache_aware_routing_of_two_replicas`` (`make test-long`)."""

from __future__ import annotations

import json
import urllib.request
from collections import Counter

import pytest

from orchestrator.config import to_specs
from orchestrator.engines import free_port, server_for
from orchestrator.engines.router import router_launch
from orchestrator.trial.servers import server_env
from testkit.fake_openai_server import FakeOpenAIServer, Script

GROUPS = {g: f"group {g}: " + " ".join(f"shared{g}-{i}" for i in range(200)) for g in "xyz"}


def _complete(url: str, prompt: str) -> None:
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 2, "stream": True}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200 and b"data:" in answer.read()


@pytest.mark.parametrize("policy", ["round_robin", "cache_aware"])
def test_the_router_routes_as_its_policy_says(compose, tmp_path, policy):
    spec, _ = to_specs(compose([f"engine.router={{replicas:2,policy:{policy}}}"]))
    with FakeOpenAIServer(Script(ttft_s=0.001, itl_s=0.001)) as a, FakeOpenAIServer(Script(ttft_s=0.001)) as b:
        routing = ["--worker-urls", a.base_url, b.base_url, "--policy", policy]
        launch = router_launch(spec, "127.0.0.1", free_port(), free_port(), routing)
        with server_for(launch, server_env(launch, []), tmp_path / "router.log") as router:
            router.wait_healthy(launch.startup_timeout_s)
            for k in range(6):
                for prefix in GROUPS.values():
                    _complete(launch.base_url, f"{prefix} question {k}")
        served = {
            name: Counter(str(r["messages"][0]["content"]).split(":")[0] for r in srv.truth.by_request.values())
            for name, srv in (("a", a), ("b", b))
        }
    assert sum(sum(c.values()) for c in served.values()) == 18, served  # every request reached a replica
    if policy == "round_robin":  # both replicas served every group
        assert all(c[f"group {g}"] == 3 for c in served.values() for g in GROUPS), served
    else:  # each prefix group stayed with the replica that has its prefix
        assert all(sorted(c[f"group {g}"] for c in served.values()) == [0, 6] for g in GROUPS), served
    # the router was stopped with its block, its process group gone (engine_processes() would see
    # the fake engines another test runs beside this one)
    assert router.proc is not None and router.proc.poll() is not None
