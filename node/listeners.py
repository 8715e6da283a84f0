"""Listeners that a stranger cannot stall or exhaust: serve's sync port, HTTP API and control socket.

aiohttp's web server has no header read timeout and no connection cap, and asyncio's accept
loop spins (and logs per attempt) when the process runs out of file descriptors. So serve does
not hand its listening sockets to ``loop.create_server``: a ``GuardedSite`` (an aiohttp
``BaseSite``, the public way to put a runner's server on a socket) accepts itself and then

* closes at once, without any work (no HTTP parser, no task), a connection over its listener's
  cap or over its source address's cap (``Limits``);
* frames the requests it forwards (``RequestFramer``: head lines, Content-Length, chunked) to
  time each of them, as aiohttp times none: a request head must be complete ``head_timeout_s``
  after the connection opened (the first request) or after its first byte (the next ones on a
  kept-alive connection), and its body ``body_timeout_s`` after its head, else the connection
  is closed. Bytes arriving one at a time reset nothing. Idle time between requests is bounded
  by aiohttp's own ``keepalive_timeout`` (the runner's);
* on the control socket (``evict_stalled``), when the listener is full, closes the oldest
  connection stalled mid-request (or that never sent one) to make room, rather than refusing
  the newcomer: a local script's stalled connections cannot lock the CLI out;
* on EMFILE/ENFILE (no descriptor left) stops accepting on that socket for ``ACCEPT_PAUSE_S``
  instead of retrying per event, and says so once (node/logthrottle.py folds the repeats).

``reserve_fds`` raises the soft RLIMIT_NOFILE to the hard limit at serve start and shrinks the
per-listener caps to what that limit can hold with ``RESERVED_FDS`` to spare, so the network
side can never take the descriptors the control socket and the databases need: the CLI stays
answerable while the sync port is saturated.

Each accepted connection is a ``_Guard`` protocol wrapped around aiohttp's own RequestHandler,
to which it forwards every protocol callback unchanged.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from aiohttp import web

from memmesh.node.conn_limits import ACCEPT_PAUSE_S, Limits, source_of
from memmesh.node.request_timing import RequestClock, listener_event

__all__ = ["GuardedSite", "sock_is_unix"]

ACCEPT_BATCH = 64  # connections taken per wake-up, so one busy listener cannot starve the loop
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class GuardedSite(web.BaseSite):
    """A runner's server on an already bound, listening socket, with ``limits`` enforced."""

    def __init__(self, runner: web.BaseRunner, sock: socket.socket, limits: Limits, label: str) -> None:
        super().__init__(runner)
        self._sock = sock
        self.limits = limits
        self.label = label  # for the log: "sync", "api", "control"
        self.open = 0
        self.per_source: Counter[str] = Counter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._paused: asyncio.TimerHandle | None = None
        self._pending: set[asyncio.Task[Any]] = set()
        self._guards: set[_Guard] = set()  # the connections held, for evict_stalled
        self._stopped = False

    @property
    def name(self) -> str:
        if sock_is_unix(self._sock):
            return f"http://unix:{self._sock.getsockname()}:"
        host, port = self._sock.getsockname()[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"

    async def start(self) -> None:
        await super().start()
        self._loop = asyncio.get_running_loop()
        self._sock.setblocking(False)
        self._loop.add_reader(self._sock.fileno(), self._accept)

    async def stop(self) -> None:
        self._stopped = True
        if self._paused is not None:
            self._paused.cancel()
        if self._loop is not None and self._sock.fileno() >= 0:
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        for task in list(self._pending):  # connections still being set up: drop them
            task.cancel()
        await super().stop()

    # ------------------------------------------------------------------ accepting
    def _accept(self) -> None:
        assert self._loop is not None
        for _ in range(ACCEPT_BATCH):
            try:
                conn, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno in _OUT_OF_FDS:
                    self._pause(exc)
                else:
                    listener_event("accept.error", logging.WARNING, listener=self.label,
                                   error=f"{type(exc).__name__}: {exc.strerror or exc}")
                return
            source = source_of(addr)
            refused = self._refusal(source)
            if refused is not None and refused.startswith("listener") and self._evict_one():
                refused = None
            if refused is not None:
                listener_event("connection.refused", logging.WARNING, listener=self.label, peer=source, reason=refused)
                _reset(conn)
                continue
            self._admit(conn, source)

    def _refusal(self, source: str | None) -> str | None:
        lim = self.limits
        if lim.per_listener is not None and self.open >= lim.per_listener:
            return f"listener cap ({lim.per_listener} connections)"
        if source is not None and lim.per_source is not None and self.per_source[source] >= lim.per_source:
            return f"per-source cap ({lim.per_source} connections)"
        return None

    def _evict_one(self) -> bool:
        """With ``evict_stalled``: close the oldest connection whose client owes bytes (mid-head,
        mid-body, or no request at all yet) so a newcomer fits; False when there is none."""
        if not self.limits.evict_stalled:
            return False
        stalled = [g for g in self._guards if g.stalled() and not g.released]
        if not stalled:
            return False
        victim = min(stalled, key=lambda g: g.since)
        listener_event("connection.evicted", logging.WARNING, listener=self.label, peer=victim.source,
                       reason=f"listener cap ({self.limits.per_listener} connections): closed the oldest stalled one")
        victim.close_now()
        return True

    def _admit(self, conn: socket.socket, source: str | None) -> None:
        assert self._loop is not None
        self.open += 1
        if source is not None:
            self.per_source[source] += 1
        guard = _Guard(self, source)
        conn.setblocking(False)

        async def connect() -> None:
            try:
                await self._loop.connect_accepted_socket(lambda: guard, conn)  # type: ignore[union-attr]
            except asyncio.CancelledError:  # serve is stopping
                guard.release()
                conn.close()
                raise
            except Exception as exc:
                guard.release()  # connection_made never came: nothing else gives the slot back
                conn.close()
                listener_event("accept.error", logging.WARNING, listener=self.label,
                               error=f"{type(exc).__name__}: {exc}")

        task = self._loop.create_task(connect())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _release(self, guard: _Guard) -> None:
        source = guard.source
        self._guards.discard(guard)
        self.open -= 1
        if source is not None:
            self.per_source[source] -= 1
            if self.per_source[source] <= 0:
                del self.per_source[source]

    def _pause(self, exc: OSError) -> None:
        """No descriptor left: stop accepting here for a while (the kernel keeps the backlog)."""
        assert self._loop is not None
        self._loop.remove_reader(self._sock.fileno())
        listener_event("accept.paused", logging.WARNING, listener=self.label,
                       error=errno.errorcode.get(exc.errno or 0, "?"), pause_s=ACCEPT_PAUSE_S, open=self.open)
        self._paused = self._loop.call_later(ACCEPT_PAUSE_S, self._resume)

    def _resume(self) -> None:
        self._paused = None
        if not self._stopped and self._loop is not None:
            self._loop.add_reader(self._sock.fileno(), self._accept)


def sock_is_unix(sock: socket.socket) -> bool:
    return hasattr(socket, "AF_UNIX") and sock.family == socket.AF_UNIX


def _reset(conn: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0): the connection's kernel state goes at once, no FIN_WAIT."""
    try:
        if not sock_is_unix(conn):
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    conn.close()


class _Guard(asyncio.Protocol):
    """One accepted connection: aiohttp's RequestHandler inside, the request timers
    (``RequestClock``) and the caps' count outside. Every callback is forwarded unchanged; only a
    timer's expiry (or an eviction) closes early."""

    def __init__(self, site: GuardedSite, source: str | None) -> None:
        self.site = site
        self.source = source
        self.inner: Any = None
        self.transport: asyncio.Transport | None = None
        self.clock = RequestClock(site.limits, site.label, source, self._abort)
        self.since = time.monotonic()
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.site._release(self)

    def stalled(self) -> bool:
        return self.clock.stalled()

    def close_now(self) -> None:
        self.site._guards.discard(self)  # chosen once: the next eviction picks another
        self.clock.stop()
        self._abort()

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.site._guards.add(self)
        server: Callable[[], Any] | None = self.site._runner.server
        assert server is not None
        self.inner = server()
        self.clock.start()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.clock.feed(data)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.clock.stop()
        self.release()
        if self.inner is not None:
            self.inner.connection_lost(exc)
