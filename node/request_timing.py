"""Each request of a connection timed, as aiohttp times none: where its head and body end in the
bytes a client sends (``RequestFramer``), the timers that close a connection whose head or body
is late (``RequestClock``), and the same timers for another server's protocol class
(``timed_protocol``: uvicorn's, for ``memmesh mcp --http``).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from memmesh.node.conn_limits import Limits, source_of

__all__ = ["RequestClock", "RequestFramer", "listener_event", "timed_protocol"]

log = logging.getLogger("memmesh.serve")


def listener_event(name: str, level: int = logging.INFO, **fields: Any) -> None:
    """A line of serve's log, folded with its repeats (node/logthrottle.py): a stranger causes
    these once per connection, so one line per interval and listener says it all."""
    log.log(level, name, extra={"fields": fields, "throttle": f"{name} {fields.get('listener')}"})


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
        listener_event("connection.timeout", logging.WARNING, listener=self.label, peer=self.peer, reason=reason)
        self.on_late()


def timed_protocol(base: type[Any], limits: Limits, label: str) -> type[Any]:
    """``base``, another server's HTTP protocol class (uvicorn's, for ``memmesh mcp --http``),
    with each request timed as a GuardedSite times it (``RequestClock``)."""

    class Timed(base):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            peer = source_of(transport.get_extra_info("peername"))
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
