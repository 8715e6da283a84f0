"""The aiohttp adapter: it only moves the sync protocol's bytes (node/sync/protocol.py).

Server: one route per sync operation under ``/sync/v1/``. A body over the cap is refused from
its Content-Length before it is read, and reading stops at the cap when the length is not
given; a client that sends slowly is cut off after ``read_timeout`` seconds while others are
served (the event loop never waits on one connection), and one that goes away mid-body gets a
400 nobody reads (one access-log line, no traceback). The bytes of bodies held at once by all
connections are bounded (``BUDGET``). The protocol runs as steps (``SyncServer.steps``): the
database steps on the node's database thread (``run``), each submitted anew so that other work
runs between the slices of a long push; decoding on one decoder thread, one body at a time,
with at most a few decoded requests held at once.

Client: ``HttpTransport`` sends a signed request to an address hint ``http:<host>:<port>`` and
returns the status, headers and body, bounded in size and time; ``run_exchange`` drives one
Exchange to its end.
"""
from __future__ import annotations

import asyncio
import errno
import functools
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from memmesh.node.sync import messages as m
from memmesh.node.sync.protocol import OFF_THREAD, PREFIX, Client, Exchange, Outgoing, Response, SyncError, SyncServer

T = TypeVar("T")
Runner = Callable[[Callable[[], T]], Awaitable[T]]


def _error_body(code: str, message: str) -> bytes:
    return m.pack(m.ErrorReply(code, message).encode())


def _error(status: int, code: str, message: str) -> web.Response:
    return web.Response(status=status, body=_error_body(code, message), content_type="application/msgpack")


# Bytes of request bodies held at once by every sync connection of this process (being read,
# or read and waiting for the database thread): 8 full bodies. Above it a request waits up to
# BUSY_WAIT_S for room, then gets 503 sync.busy (the peer tries again next round): a node's
# memory is bounded by this whatever the number of connections, and honest peers, which send
# one body at a time per exchange, rarely meet it.
MAX_BYTES_IN_FLIGHT = 64 * 1024 * 1024
BUSY_WAIT_S = 2.0


class BodyBudget:
    """One process-wide bound on the bytes of sync bodies in flight (see MAX_BYTES_IN_FLIGHT)."""

    def __init__(self, limit: int = MAX_BYTES_IN_FLIGHT) -> None:
        self.limit = limit
        self.held = 0
        self._freed: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def try_take(self, n: int) -> bool:
        if self.held + n > self.limit:
            return False
        self.held += n
        return True

    async def take(self, n: int, wait_s: float) -> bool:
        """Reserve ``n`` bytes, waiting up to ``wait_s`` for others to give theirs back."""
        if self.try_take(n):
            return True
        if n > self.limit:
            return False
        loop = asyncio.get_running_loop()
        if self._freed is None or self._loop is not loop:  # one process-wide budget, any loop
            self._freed, self._loop = asyncio.Condition(), loop
        try:
            async with self._freed:
                await asyncio.wait_for(self._freed.wait_for(lambda: self.held + n <= self.limit), wait_s)
        except TimeoutError:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n
        if self._freed is not None and self._loop is asyncio.get_running_loop():
            freed = self._freed

            async def _notify() -> None:
                async with freed:
                    freed.notify_all()

            asyncio.ensure_future(_notify())


BUDGET = BodyBudget()  # shared by every sync app of the process


def _busy() -> web.Response:
    return _error(503, "sync.busy", "this node is receiving too many request bodies at once; retry later")


def _advance(steps: Any) -> tuple[bool, Any]:
    try:
        return False, next(steps)
    except StopIteration as done:
        return True, done.value


# Decoding runs here, one body at a time, off the database thread: the database thread stays
# free, and the memory a decoded body takes is held for one body at a time.
_DECODER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memmesh-sync-decode")
# Requests decoded at once (being decoded, or decoded and waiting for or running on the database
# thread): a decoded body takes up to a few times its bytes (at most what its type can hold,
# docs/protocol.md 6.3), so this bounds that memory; the others wait holding their raw bytes
# only, which BUDGET bounds.
MAX_DECODED = 4


def sync_app_routes(app: web.Application, server: SyncServer, run: Runner, *, read_timeout: float = 30.0,
                    budget: BodyBudget | None = None) -> None:
    """Add the sync API to ``app`` (create it with ``client_max_size=MAX_BODY_BYTES``)."""
    budget = budget or BUDGET
    decoded: list[asyncio.Semaphore] = []  # made on the serving loop, on first use

    async def handle(request: web.Request) -> web.StreamResponse:
        length = request.content_length
        if length is not None and length > m.MAX_BODY_BYTES:
            return _error(413, "sync.too_large", f"bodies are at most {m.MAX_BODY_BYTES} bytes")
        held = [0]
        try:
            if length is not None:
                if not await budget.take(length, BUSY_WAIT_S):
                    return _busy()
                held[0] = length
            try:
                body = await asyncio.wait_for(_read_capped(request, budget, held), timeout=read_timeout)
            except TimeoutError:
                return _error(408, "sync.timeout", "the request body was not sent in time")
            except _TooLarge:
                return _error(413, "sync.too_large", f"bodies are at most {m.MAX_BODY_BYTES} bytes")
            except _Busy:
                return _busy()
            except (ConnectionError, aiohttp.ClientPayloadError, EOFError) as exc:
                # The client went away mid-body: nobody reads the answer; the access log's line
                # (status 400) is the only trace, no traceback.
                return _error(400, "sync.aborted", f"the request body was cut off ({exc.__class__.__name__})")
            signed = [(k.lower(), v) for k, v in request.headers.items() if k.lower().startswith("memmesh-")]
            headers = dict(signed)
            if len(headers) != len(signed):  # which of two values was signed is not for us to guess
                twice = sorted({k for k, _v in signed if sum(1 for k2, _ in signed if k2 == k) > 1})
                return _error(401, "sync.unauthenticated", f"{', '.join(twice)[:80]} given more than once")
            if not decoded:
                decoded.append(asyncio.Semaphore(MAX_DECODED))
            resp = await _drive(server.steps(request.method, request.path, headers, body), run, decoded[0])
        finally:
            if held[0]:
                budget.give(held[0])
        return web.Response(status=resp.status, headers=resp.headers, body=resp.body)

    app.router.add_route("*", PREFIX + "{op}", handle)


async def _drive(steps: Any, run: Runner, decoded: asyncio.Semaphore) -> Response:
    """Run a request's steps: database steps on the database thread, each submitted anew so that
    work queued meanwhile (a status call, another peer's request) runs between them; decoding
    on the decoder, holding one of the ``decoded`` slots until the request is done."""
    loop = asyncio.get_running_loop()
    marker = None
    slot = False
    try:
        while True:
            if marker == OFF_THREAD:
                if not slot:
                    await decoded.acquire()
                    slot = True
                done, value = await loop.run_in_executor(_DECODER, _advance, steps)
            else:
                done, value = await run(lambda: _advance(steps))
            if done:
                return value
            marker = value
    finally:
        if slot:
            decoded.release()


class _TooLarge(Exception):
    pass


class _Busy(Exception):
    pass


async def _read_capped(request: web.Request, budget: BodyBudget, held: list[int]) -> bytearray:
    """The body, at most MAX_BODY_BYTES; bytes beyond what ``held`` reserved are taken from the
    budget as they arrive (a body sent without Content-Length)."""
    body = bytearray()
    async for chunk in request.content.iter_chunked(64 * 1024):
        if len(body) + len(chunk) > m.MAX_BODY_BYTES:
            raise _TooLarge()
        more = len(body) + len(chunk) - held[0]
        if more > 0:
            if not budget.try_take(more):
                raise _Busy()
            held[0] += more
        body += chunk
    if request.content_length is not None and len(body) < request.content_length:
        raise EOFError("the body ended before its Content-Length")
    return body


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
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise SyncError("sync.unreachable", unreachable(address, exc, self.timeout.total)) from None


def unreachable(address: str, exc: BaseException, timeout_s: float | None) -> str:
    """A sentence for a failed request (operators read it in status, the cockpit and sync's
    output), not aiohttp's repr with its ssl:default and connection key."""
    where = address[len("http:"):] if address.startswith("http:") else address
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return f"no answer from {where} within {timeout_s:g} s" if timeout_s else f"no answer from {where} in time"
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return f"cannot connect to {where} (its host name does not resolve)"
    cause = getattr(exc, "os_error", exc)
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ServerDisconnectedError) or isinstance(cause, OSError):
        why = {errno.ECONNREFUSED: "connection refused", errno.ETIMEDOUT: "timed out",
               errno.EHOSTUNREACH: "no route to the host", errno.ENETUNREACH: "no route to the network",
               errno.ECONNRESET: "the connection was reset"}.get(getattr(cause, "errno", None) or -1)
        if why is None:
            why = "the peer closed the connection" if isinstance(exc, aiohttp.ServerDisconnectedError) \
                else (getattr(cause, "strerror", None) or str(cause) or type(exc).__name__).lower()
        return f"cannot connect to {where} ({why})"
    return f"cannot reach {where}: {str(exc) or type(exc).__name__}"


async def call(transport: HttpTransport, client: Client, address: str, target: str, message: Any) -> tuple[str, Any]:
    out = client.request(target, message)
    status, headers, body = await transport.send(address, out)
    return client.reply(out, status, headers, body)


async def run_exchange(transport: HttpTransport, client: Client, address: str, target: str,
                       exchange: Exchange, run: Runner) -> Exchange:
    """Drive ``exchange`` against the node ``target`` at ``address`` until it is done.

    A pulled page is taken in on the database thread while the request for the next one
    (``Exchange.pull_ahead``) runs here on the loop: one page ahead at most, each request with
    the transport's bounds of size and time."""
    ahead: tuple[Any, asyncio.Future[tuple[str, Any]]] | None = None
    try:
        while True:
            message = await run(exchange.next_message)
            if message is None:
                return exchange
            if ahead is not None and message is ahead[0]:
                _node, reply = await ahead[1]
            else:
                if ahead is not None:
                    _drop(ahead[1])
                _node, reply = await call(transport, client, address, target, message)
            ahead = None
            following = await run(functools.partial(exchange.pull_ahead, reply)) if exchange.pulls_ahead else None
            if following is not None:
                ahead = following, asyncio.ensure_future(call(transport, client, address, target, following))
            await run(functools.partial(exchange.on_reply, reply))
            while await run(exchange.work):  # a large page in slices: other work runs in between
                pass
    finally:
        if ahead is not None:
            _drop(ahead[1])


def _drop(request: asyncio.Future[Any]) -> None:
    """Cancel a request asked ahead whose reply is not wanted (a failure it met is no one's)."""
    request.cancel()
    request.add_done_callback(lambda f: f.cancelled() or f.exception())
