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
import ipaddress
import logging
import os
import socket
import struct
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Callable

from aiohttp import web

from memmesh.auth.errors import MemmeshError

__all__ = ["ACCEPT_PAUSE_S", "BODY_TIMEOUT_S", "HEAD_TIMEOUT_S", "KEEPALIVE_S", "MAX_PER_LISTENER", "MAX_PER_SOURCE",
           "RESERVED_FDS", "GuardedSite", "Limits", "LimitsError", "RequestClock", "RequestFramer", "reserve_fds",
           "timed_protocol"]

# A well-behaved client (our own sync client, curl, a browser) sends its whole request head in one
# write, milliseconds after connecting; 10 s still covers a lossy link's retransmissions (1+2+4 s)
# and bounds what a slow-header client holds: a slot for 10 s, not forever.
HEAD_TIMEOUT_S = 10.0
# A request body (8 MiB at most on the sync port, 1 MiB on the API) must be complete this long
# after its head. Above the sync routes' own read timeout (30 s), so those answer 408 first;
# the backstop for every other route (the API's, the control socket's, an unknown path's, an
# Expect: 100-continue that never sends its body), none of which times its body itself.
BODY_TIMEOUT_S = 40.0
# Idle time allowed between requests on one connection (and for the next request's head). Above
# aiohttp's client keep-alive (15 s), so our own sync client drops an idle connection first and
# never reuses one the server is closing; the default sync interval (5 s) reuses well within it.
KEEPALIVE_S = 20.0
# Far above what a node needs (peers x fanout, a handful of API clients), far below the
# descriptors a process gets once reserve_fds raised its limit (1,024 is the usual floor).
MAX_PER_LISTENER = 256
# One address gets an eighth of a listener: several peers behind one NAT still fit, and eight
# addresses are needed to fill a listener. IPv6 sources count per /64 (what one host is given).
MAX_PER_SOURCE = 32
RESERVED_FDS = 128  # for the databases, the log, outgoing sync connections, DNS, the control socket's clients
ACCEPT_PAUSE_S = 1.0  # how long a listener stops accepting when no descriptor is left
ACCEPT_BATCH = 64  # connections taken per wake-up, so one busy listener cannot starve the loop

ENV = {"head_timeout_s": "MEMMESH_HEAD_TIMEOUT_S", "body_timeout_s": "MEMMESH_BODY_TIMEOUT_S",
       "per_listener": "MEMMESH_MAX_CONNECTIONS", "per_source": "MEMMESH_MAX_CONNECTIONS_PER_SOURCE",
       "keepalive_s": "MEMMESH_KEEPALIVE_S"}

log = logging.getLogger("memmesh.serve")
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class LimitsError(MemmeshError):
    """A connection limit given in the environment is not a number serve can use."""


def _event(name: str, level: int = logging.INFO, **fields: Any) -> None:
    """A line of serve's log, folded with its repeats (node/logthrottle.py): a stranger causes
    these once per connection, so one line per interval and listener says it all."""
    log.log(level, name, extra={"fields": fields, "throttle": f"{name} {fields.get('listener')}"})


@dataclass(frozen=True)
class Limits:
    """What one listener allows. None: no bound of that kind (the control socket's per-source
    bound: only the home's owner can connect to it)."""

    head_timeout_s: float | None = HEAD_TIMEOUT_S
    keepalive_s: float = KEEPALIVE_S
    per_listener: int | None = MAX_PER_LISTENER
    per_source: int | None = MAX_PER_SOURCE
    body_timeout_s: float | None = BODY_TIMEOUT_S
    evict_stalled: bool = False  # at the listener cap, close a stalled connection instead of refusing

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "Limits":
        """The defaults, each overridable by its environment variable (``ENV``; for tests and for
        operators who know their load)."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field, var in ENV.items():
            raw = environ.get(var)
            if raw is None or raw == "":
                continue
            try:
                value = float(raw) if field.endswith("_s") else int(raw)
            except ValueError:
                raise LimitsError(f"{var} should be a {'number of seconds' if field.endswith('_s') else 'whole number'}"
                                  f", got {raw!r}") from None
            if not value > 0 or value != value or value == float("inf"):
                raise LimitsError(f"{var} should be greater than 0, got {raw!r}")
            values[field] = value
        return cls(**values)

    def within(self, fds_for_listener: int) -> "Limits":
        """These limits with the listener cap no larger than ``fds_for_listener``."""
        cap = fds_for_listener if self.per_listener is None else min(self.per_listener, fds_for_listener)
        source = None if self.per_source is None else min(self.per_source, cap)
        return replace(self, per_listener=cap, per_source=source)


def reserve_fds(listeners: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (as far as the kernel allows);
    how many descriptors each of ``listeners`` listeners may use, RESERVED_FDS kept aside."""
    try:
        import resource
    except ImportError:  # not on this platform: assume the common 1,024
        return max(8, (1024 - RESERVED_FDS) // listeners)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for target in (hard, 1 << 20, 65536):  # RLIM_INFINITY / above nr_open are refused: try less
        if target == resource.RLIM_INFINITY or (soft != resource.RLIM_INFINITY and target <= soft):
            continue
        if hard != resource.RLIM_INFINITY and target > hard:
            continue
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
            break
        except (ValueError, OSError):
            continue
    usable = 1 << 20 if soft == resource.RLIM_INFINITY else soft
    return max(8, (usable - RESERVED_FDS) // listeners)


def _source(addr: Any) -> str | None:
    """The address a per-source cap counts: the IP (an IPv6 one as its /64), None for a Unix peer."""
    if not isinstance(addr, tuple) or not addr:
        return None
    try:
        ip = ipaddress.ip_address(str(addr[0]).split("%", 1)[0])
    except ValueError:
        return str(addr[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{ip}/64", strict=False))
    return str(ip)


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
                    _event("accept.error", logging.WARNING, listener=self.label,
                           error=f"{type(exc).__name__}: {exc.strerror or exc}")
                return
            source = _source(addr)
            refused = self._refusal(source)
            if refused is not None and refused.startswith("listener") and self._evict_one():
                refused = None
            if refused is not None:
                _event("connection.refused", logging.WARNING, listener=self.label, peer=source, reason=refused)
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
        _event("connection.evicted", logging.WARNING, listener=self.label, peer=victim.source,
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
                _event("accept.error", logging.WARNING, listener=self.label, error=f"{type(exc).__name__}: {exc}")

        task = self._loop.create_task(connect())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _release(self, guard: "_Guard") -> None:
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
        _event("accept.paused", logging.WARNING, listener=self.label, error=errno.errorcode.get(exc.errno or 0, "?"),
               pause_s=ACCEPT_PAUSE_S, open=self.open)
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


class RequestFramer:
    """Where each request's head and body end in the bytes a client sends, found as they arrive
    (request line and header lines, Content-Length, chunked with its trailers), to time them;
    nothing is parsed for meaning, aiohttp does that. What it cannot frame (a line longer than
    any aiohttp accepts, a length that is not a number) aiohttp refuses with a 400 and closes:
    framing stops there (``lost``) and the timers running go on."""

    MAX_LINE = 16384  # above aiohttp's 8,190-byte line and field limits

    def __init__(self) -> None:
        self.phase = "head"  # head | length | chunk-size | chunk-data | chunk-end | trailer | lost
        self.started = False  # the current head has had a byte
        self.requests = 0  # heads completed
        self.messages = 0  # heads started: identifies the one being timed
        self._line = bytearray()
        self._remaining = 0
        self._length: int | None = 0
        self._chunked = False
        self._lines = 0

    @property
    def in_head(self) -> bool:
        return self.phase == "head" and self.started

    @property
    def in_body(self) -> bool:
        return self.phase in ("length", "chunk-size", "chunk-data", "chunk-end", "trailer")

    def feed(self, data: bytes) -> None:
        i, n = 0, len(data)
        while i < n and self.phase != "lost":
            if self.phase == "length":
                take = min(self._remaining, n - i)
                self._remaining -= take
                i += take
                if self._remaining == 0:
                    self._next_head()
                continue
            if self.phase == "chunk-data":
                take = min(self._remaining, n - i)
                self._remaining -= take
                i += take
                if self._remaining == 0:
                    self.phase = "chunk-end"
                continue
            if self.phase == "head" and not self.started:
                self.started = True
                self.messages += 1
            end = data.find(b"\n", i)
            if end < 0:
                self._line += data[i:]
                if len(self._line) > self.MAX_LINE:
                    self.phase = "lost"
                return
            self._line += data[i:end]
            i = end + 1
            line = bytes(self._line).rstrip(b"\r")
            self._line.clear()
            if len(line) > self.MAX_LINE:
                self.phase = "lost"
                return
            self._on_line(line)

    def _on_line(self, line: bytes) -> None:
        if self.phase == "head":
            if self._lines == 0 and not line:
                return  # empty lines before a request line are allowed (RFC 9112 2.2)
            self._lines += 1
            if self._lines > 1 and not line:
                self._head_done()
                return
            name, sep, value = line.partition(b":")
            name = name.strip().lower()
            if self._lines > 1 and sep and name == b"content-length":
                text = value.strip()
                self._length = int(text) if text.isdigit() and len(text) < 19 else None
            elif self._lines > 1 and sep and name == b"transfer-encoding":
                self._chunked = b"chunked" in value.lower()
        elif self.phase == "chunk-size":
            size = line.split(b";", 1)[0].strip()
            try:
                self._remaining = int(size, 16)
            except ValueError:
                self.phase = "lost"
                return
            self.phase = "chunk-data" if self._remaining else "trailer"
        elif self.phase == "chunk-end":
            self.phase = "chunk-size"
        elif self.phase == "trailer" and not line:
            self._next_head()

    def _head_done(self) -> None:
        self.requests += 1
        if self._chunked:  # Transfer-Encoding wins over Content-Length (RFC 9112 6.3)
            self.phase = "chunk-size"
        elif self._length is None:
            self.phase = "lost"
        elif self._length > 0:
            self.phase, self._remaining = "length", self._length
        else:
            self._next_head()

    def _next_head(self) -> None:
        self.phase, self.started, self._lines = "head", False, 0
        self._length, self._chunked = 0, False


class RequestClock:
    """The request timers of one connection: the head ``limits.head_timeout_s`` from its start
    (the connection's, for the first request; its first byte, for the next), the body
    ``limits.body_timeout_s`` from its head; ``on_late`` closes the connection. ``feed`` every
    byte the client sends, ``stop`` when the connection is gone."""

    def __init__(self, limits: Limits, label: str, peer: str | None, on_late: Callable[[], None]) -> None:
        self.limits = limits
        self.label = label
        self.peer = peer
        self.on_late = on_late
        self.framer = RequestFramer()
        self.timer: asyncio.TimerHandle | None = None
        self.timing: tuple[str, int] | None = None  # ("head" | "body", message number) being timed

    def start(self) -> None:
        self._arm("head", 1)  # the first head is timed from the connection's start

    def feed(self, data: bytes) -> None:
        f = self.framer
        f.feed(data)
        if f.in_head:
            self._arm("head", f.messages)
        elif f.in_body:
            self._arm("body", f.messages)
        elif f.phase != "lost":
            self.stop()  # between requests: the server's keep-alive timer bounds the wait

    def stalled(self) -> bool:
        """Its client owes bytes: no request yet, or one begun and not finished sending."""
        f = self.framer
        return f.requests == 0 or f.in_head or f.in_body

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.timing = None

    def _arm(self, what: str, message: int) -> None:
        if self.timing == (what, message):
            return  # the same head or body: its clock runs from its start, bytes reset nothing
        self.stop()
        timeout = self.limits.head_timeout_s if what == "head" else self.limits.body_timeout_s
        if timeout is not None:
            self.timing = (what, message)
            self.timer = asyncio.get_running_loop().call_later(timeout, self._late, what, timeout)

    def _late(self, what: str, timeout: float) -> None:
        self.timer = self.timing = None
        reason = (f"no complete request head within {timeout:g} s" if what == "head"
                  else f"the request body was not complete {timeout:g} s after its head")
        _event("connection.timeout", logging.WARNING, listener=self.label, peer=self.peer, reason=reason)
        self.on_late()


def timed_protocol(base: type[Any], limits: Limits, label: str) -> type[Any]:
    """``base``, another server's HTTP protocol class (uvicorn's, for ``memmesh mcp --http``),
    with each request timed as a GuardedSite times it (``RequestClock``)."""

    class Timed(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            peer = _source(transport.get_extra_info("peername"))
            self._memmesh_clock = RequestClock(limits, label, peer, transport.abort)  # type: ignore[attr-defined]
            self._memmesh_clock.start()
            super().connection_made(transport)

        def data_received(self, data: bytes) -> None:
            self._memmesh_clock.feed(data)
            super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            self._memmesh_clock.stop()
            super().connection_lost(exc)

    Timed.__name__ = Timed.__qualname__ = f"Timed{base.__name__}"
    return Timed


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
