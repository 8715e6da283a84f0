"""The aiohttp adapter: it only moves the sync protocol's bytes (node/sync/protocol.py).

Server: one route per sync operation under ``/sync/v1/``. A body over the cap is refused from
its Content-Length before it is read, and reading stops at the cap when the length is not
given; a client that sends slowly is cut off after ``read_timeout`` seconds while others are
served (the event loop never waits on one connection). The protocol itself runs on the
node's database thread (``run``), so a large page never stalls the loop.

Client: ``HttpTransport`` sends a signed request to an address hint ``http:<host>:<port>`` and
returns the status, headers and body, bounded in size and time; ``run_exchange`` drives one
Exchange to its end.
"""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, TypeVar

import aiohttp
from aiohttp import web

from node.sync import messages as m
from node.sync.protocol import PREFIX, Client, Exchange, Outgoing, SyncError, SyncServer

T = TypeVar("T")
Runner = Callable[[Callable[[], T]], Awaitable[T]]


def _error_body(code: str, message: str) -> bytes:
    return m.pack(m.ErrorReply(code, message).encode())


def sync_app_routes(app: web.Application, server: SyncServer, run: Runner, *, read_timeout: float = 30.0) -> None:
    """Add the sync API to ``app`` (create it with ``client_max_size=MAX_BODY_BYTES``)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        length = request.content_length
        if length is not None and length > m.MAX_BODY_BYTES:
            return web.Response(status=413, body=_error_body("sync.too_large", f"bodies are at most {m.MAX_BODY_BYTES} bytes"),
                                content_type="application/msgpack")
        try:
            body = await asyncio.wait_for(_read_capped(request), timeout=read_timeout)
        except asyncio.TimeoutError:
            return web.Response(status=408, body=_error_body("sync.timeout", "the request body was not sent in time"),
                                content_type="application/msgpack")
        except _TooLarge:
            return web.Response(status=413, body=_error_body("sync.too_large", f"bodies are at most {m.MAX_BODY_BYTES} bytes"),
                                content_type="application/msgpack")
        headers = {k.lower(): v for k, v in request.headers.items() if k.lower().startswith("memmesh-")}
        resp = await run(lambda: server.handle(request.method, request.path, headers, body))
        return web.Response(status=resp.status, headers=resp.headers, body=resp.body)

    app.router.add_route("*", PREFIX + "{op}", handle)


class _TooLarge(Exception):
    pass


async def _read_capped(request: web.Request) -> bytes:
    chunks = []
    total = 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        total += len(chunk)
        if total > m.MAX_BODY_BYTES:
            raise _TooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


def url_of(address: str) -> str:
    """``http:<host>:<port>`` (the address-hint form of tickets and peer exchange) as a URL."""
    if not address.startswith("http:") or address.startswith("http://"):
        raise SyncError("sync.address", f"an address hint looks like http:<host>:<port>, got {address!r}")
    return "http://" + address[len("http:"):]


class HttpTransport:
    def __init__(self, session: aiohttp.ClientSession, *, timeout: float = 30.0) -> None:
        self.session = session
        self.timeout = aiohttp.ClientTimeout(total=timeout)

    async def send(self, address: str, out: Outgoing) -> tuple[int, dict[str, str], bytes]:
        r = out.request
        try:
            async with self.session.post(url_of(address) + r.path, data=r.body,
                                         headers={**r.headers, "content-type": "application/msgpack"},
                                         timeout=self.timeout, allow_redirects=False) as resp:
                if resp.content_length is not None and resp.content_length > m.MAX_BODY_BYTES:
                    raise SyncError("sync.too_large", f"the peer at {address} answered with more than {m.MAX_BODY_BYTES} bytes")
                # read(n) returns what is buffered, not n bytes: read to the end, bounded.
                chunks, total = [], 0
                async for chunk in resp.content.iter_chunked(64 * 1024):
                    total += len(chunk)
                    if total > m.MAX_BODY_BYTES:
                        raise SyncError("sync.too_large", f"the peer at {address} answered with more than {m.MAX_BODY_BYTES} bytes")
                    chunks.append(chunk)
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}, b"".join(chunks)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise SyncError("sync.unreachable", f"cannot reach {address}: {exc.__class__.__name__}: {exc}") from None


async def call(transport: HttpTransport, client: Client, address: str, target: str, message: Any) -> tuple[str, Any]:
    out = client.request(target, message)
    status, headers, body = await transport.send(address, out)
    return client.reply(out, status, headers, body)


async def run_exchange(transport: HttpTransport, client: Client, address: str, target: str,
                       exchange: Exchange, run: Runner) -> Exchange:
    """Drive ``exchange`` against the node ``target`` at ``address`` until it is done."""
    while True:
        message = await run(exchange.next_message)
        if message is None:
            return exchange
        _node, reply = await call(transport, client, address, target, message)
        await run(lambda: exchange.on_reply(reply))
