"""The front of a vLLM prefill/decode pair (NIXL connector): an OpenAI-compatible proxy.

Each request is first sent to the prefill server as a one-token, non-streaming request
with ``kv_transfer_params.do_remote_decode``; the prefill server computes the KV cache
and answers with the ``kv_transfer_params`` the decode server needs to pull it. The
original request then goes to the decode server with those parameters, and its answer
(streamed or not) is passed through unchanged. This is the protocol of vLLM's NIXL
integration proxy, written here so the product does not depend on a file vLLM keeps in
its tests.

    python -m orchestrator.engines.pd_proxy --prefill http://127.0.0.1:8100 \\
        --decode http://127.0.0.1:8200 --port 8000

``GET /health`` answers 200 when both servers do. The trial measures at this proxy, so
TTFT includes the KV transfer.
"""

from __future__ import annotations

import argparse
import copy
from typing import Any

import aiohttp
from aiohttp import web

FORWARDED_HEADERS = ("Authorization", "X-Request-Id")


def prefill_request(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill leg: one token, no streaming, asking the server to keep the KV for a remote decode."""
    req = copy.deepcopy(body)
    req["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    req["stream"] = False
    req.pop("stream_options", None)
    req["max_tokens"] = 1
    if "max_completion_tokens" in req:
        req["max_completion_tokens"] = 1
    return req


def decode_request(body: dict[str, Any], kv_transfer_params: dict[str, Any] | None) -> dict[str, Any]:
    req = copy.deepcopy(body)
    if kv_transfer_params:
        req["kv_transfer_params"] = kv_transfer_params
    return req


class PDProxy:
    def __init__(self, prefill: str, decode: str) -> None:
        self.prefill, self.decode = prefill.rstrip("/"), decode.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def _start(self, app: web.Application) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )

    async def _stop(self, app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self.session is not None
        body = await request.json()
        headers = {k: request.headers[k] for k in FORWARDED_HEADERS if k in request.headers}  # case-insensitive
        async with self.session.post(self.prefill + request.path, json=prefill_request(body), headers=headers) as r:
            if r.status != 200:
                return web.Response(status=r.status, body=await r.read(), content_type="application/json")
            kv_params = (await r.json()).get("kv_transfer_params")
        async with self.session.post(
            self.decode + request.path, json=decode_request(body, kv_params), headers=headers
        ) as r:
            resp = web.StreamResponse(
                status=r.status, headers={"Content-Type": r.headers.get("Content-Type", "application/json")}
            )
            await resp.prepare(request)
            async for chunk in r.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def _health(self, request: web.Request) -> web.Response:
        assert self.session is not None
        for url in (self.prefill, self.decode):
            try:
                async with self.session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as r:
                    if r.status != 200:
                        return web.Response(status=503, text=f"{url} answered {r.status}")
            except aiohttp.ClientError as exc:
                return web.Response(status=503, text=f"{url}: {exc}")
        return web.Response(text="ok")

    async def _models(self, request: web.Request) -> web.Response:
        assert self.session is not None
        async with self.session.get(self.decode + "/v1/models") as r:
            return web.Response(status=r.status, body=await r.read(), content_type="application/json")

    def app(self) -> web.Application:
        app = web.Application()
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        app.router.add_post("/v1/completions", self._forward)
        app.router.add_post("/v1/chat/completions", self._forward)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        return app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="prefill/decode proxy for vLLM's NIXL connector")
    ap.add_argument("--prefill", required=True, help="base URL of the prefill server")
    ap.add_argument("--decode", required=True, help="base URL of the decode server")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args(argv)
    web.run_app(PDProxy(a.prefill, a.decode).app(), host=a.host, port=a.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
