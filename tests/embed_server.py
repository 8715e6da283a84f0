"""A real local HTTP server speaking the OpenAI embeddings protocol and Ollama's /api/embed, for tests.

It runs aiohttp on 127.0.0.1 with an ephemeral port, in a background thread with its own event loop
(``with EmbedServer() as srv: srv.base_url``), or as a program (``python tests/embed_server.py``).

The behaviour is chosen by the first path segment of the URL, so one server serves every case:
``{srv.url("ok")}/v1/embeddings``, ``{srv.url("hang")}/api/embed`` ...

  ok         deterministic vectors of ``dim`` numbers (a function of the text only)
  status500  HTTP 500 with a JSON error
  malformed  HTTP 200 with a body that is not JSON
  wrongdim   HTTP 200 with vectors of dim + 1 numbers
  shuffled   OpenAI only: the data items in reverse order (the client must sort by index)
  hang       accepts the request and never answers (until the server stops)
  trickle    sends the status line and headers, then one byte of body every 0.5 s

Every request is recorded (mode, path, headers, JSON body) in ``srv.requests``.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiohttp import web

MODES = ("ok", "status500", "malformed", "wrongdim", "shuffled", "hang", "trickle")


def vector_for(text: str, dim: int) -> list[float]:
    """The deterministic (not normalised) vector the server returns for a text."""
    seed = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).normal(size=dim).round(6).tolist()


@dataclass
class Recorded:
    mode: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class EmbedServer:
    dim: int = 8
    host: str = "127.0.0.1"
    port: int = 0
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # -- HTTP handlers ----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/{mode}/v1/embeddings", self._openai)
        app.router.add_post("/{mode}/api/embed", self._ollama)
        return app

    async def _common(self, request: web.Request) -> tuple[str, Any, web.StreamResponse | None]:
        mode = request.match_info["mode"]
        try:
            body = await request.json()
        except Exception:
            body = None
        self.requests.append(Recorded(mode, request.path, dict(request.headers), body))
        if mode not in MODES:
            return mode, body, web.json_response({"error": f"unknown mode {mode}"}, status=404)
        if mode == "status500":
            return mode, body, web.json_response({"error": {"message": "internal failure"}}, status=500)
        if mode == "malformed":
            return mode, body, web.Response(text='{"data": [ this is not json', content_type="application/json")
        if mode == "hang":
            assert self._stopping is not None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=120)
            return mode, body, web.json_response({"error": "gave up"}, status=503)
        if mode == "trickle":
            resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            resp.content_length = 10_000
            await resp.prepare(request)
            assert self._stopping is not None
            for _ in range(240):
                if self._stopping.is_set():
                    break
                try:
                    await resp.write(b" ")
                except (ConnectionError, RuntimeError):
                    break
                await asyncio.sleep(0.5)
            return mode, body, resp
        if not isinstance(body, dict) or not isinstance(body.get("input"), list):
            return mode, body, web.json_response({"error": "input must be a list"}, status=400)
        return mode, body, None

    def _vectors(self, mode: str, texts: list[str]) -> list[list[float]]:
        dim = self.dim + 1 if mode == "wrongdim" else self.dim
        return [vector_for(t, dim) for t in texts]

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        mode, body, early = await self._common(request)
        if early is not None:
            return early
        vecs = self._vectors(mode, body["input"])
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vecs)]
        if mode == "shuffled":
            data.reverse()
        return web.json_response({"object": "list", "data": data, "model": body.get("model"),
                                  "usage": {"prompt_tokens": 0, "total_tokens": 0}})

    async def _ollama(self, request: web.Request) -> web.StreamResponse:
        mode, body, early = await self._common(request)
        if early is not None:
            return early
        return web.json_response({"model": body.get("model"), "embeddings": self._vectors(mode, body["input"])})

    # -- life cycle -----------------------------------------------------------------------------

    def url(self, mode: str = "ok") -> str:
        return f"http://{self.host}:{self.port}/{mode}"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def _start(self) -> None:
        self._stopping = asyncio.Event()
        self._runner = web.AppRunner(self.app(), shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._start())
        except BaseException as exc:  # reported to start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        loop.run_forever()
        loop.close()

    def start(self) -> EmbedServer:
        self._thread = threading.Thread(target=self._main, name="embed-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("embed server did not start")
        if self._error is not None:
            raise RuntimeError(f"embed server failed: {self._error}")
        return self

    async def _stop(self) -> None:
        assert self._stopping is not None and self._runner is not None
        self._stopping.set()
        await self._runner.cleanup()

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._stop(), self._loop)
        try:
            fut.result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> EmbedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--dim", type=int, default=8)
    args = ap.parse_args()
    srv = EmbedServer(dim=args.dim, port=args.port)
    srv.start()
    print(json.dumps({"base_url": srv.base_url, "modes": list(MODES)}), flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
