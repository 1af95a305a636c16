"""The P/D proxy between two scripted servers: the prefill leg is a one-token, non-streaming
request asking for a remote decode; the decode leg carries the prefill's kv_transfer_params
and streams back through the proxy to our client."""

from __future__ import annotations

import asyncio
import threading

import pytest
from aiohttp import web

from orchestrator.config.schema import WorkloadSpec
from orchestrator.engines.pd_proxy import PDProxy, decode_request, prefill_request
from orchestrator.engines.ports import free_port
from orchestrator.loadgen import Endpoint, PromptFactory, run_points
from testkit.fake_openai_server import FakeOpenAIServer, Script

pytestmark = pytest.mark.measures


def test_prefill_and_decode_requests():
    body = {"model": "m", "prompt": "hi", "max_tokens": 64, "stream": True, "stream_options": {"include_usage": True}}
    p = prefill_request(body)
    assert p["max_tokens"] == 1 and p["stream"] is False and "stream_options" not in p
    assert p["kv_transfer_params"]["do_remote_decode"] is True
    d = decode_request(body, {"remote_engine_id": "e"})
    assert d["kv_transfer_params"] == {"remote_engine_id": "e"} and d["max_tokens"] == 64 and d["stream"] is True
    assert body["max_tokens"] == 64 and "kv_transfer_params" not in body  # the original is untouched


@pytest.fixture
def proxy_between_fakes():
    with (
        FakeOpenAIServer(Script(ttft_s=0.01, itl_s=0.002)) as prefill,
        FakeOpenAIServer(Script(ttft_s=0.01, itl_s=0.002)) as decode,
    ):
        port = free_port()
        loop = asyncio.new_event_loop()
        runner = web.AppRunner(PDProxy(prefill.base_url, decode.base_url).app())
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
            ready.set()
            loop.run_forever()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        ready.wait(10)
        try:
            yield f"http://127.0.0.1:{port}", prefill, decode
        finally:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)


def test_requests_flow_through_the_proxy(proxy_between_fakes, tiny_model_dir):
    url, prefill, decode = proxy_between_fakes
    w = WorkloadSpec.model_validate(
        {
            "name": "pd",
            "classes": {"a": {"input_tokens": 16, "output_tokens": 6}},
            "load_points": [{"concurrency": 2}],
            "num_requests": 4,
            "warmup_requests": 0,
        }
    )
    records = run_points(Endpoint(url, "m"), w, PromptFactory(str(tiny_model_dir)), seed=0)
    assert len(records) == 4 and all(r.ok for r in records)
    assert all(r.output_tokens == 6 and len(r.chunk_times_s) == 6 for r in records)
    for r in records:
        rid = f"lab-{r.request_id}"
        p, d = prefill.truth.by_request[rid], decode.truth.by_request[rid]
        assert p["stream"] is False and p["kv_transfer_params"]["do_remote_decode"] is True
        assert d["stream"] is True
        assert d["kv_transfer_params"]["remote_engine_id"] == f"fake-{prefill.port}"
