"""A small fault-injecting TCP proxy for multi-process sync tests (loopback only).

Each proxy forwards 127.0.0.1:<port> to a node's real port, in a thread with its own event
loop. ``cut()`` drops every open connection and refuses new ones (the link is down);
``heal()`` brings it back. Used to partition nodes without killing them.

It also counts the bytes it forwards (``bytes_up``: client to node, ``bytes_down``: node to
client; ``counts()`` / ``reset_counts()``), which is what a benchmark needs for wire bytes.

``block(keys)`` refuses only some callers: a connection whose first HTTP request carries a
``memmesh-key`` header (every sync request does, docs/protocol.md section 6) naming one of
``keys`` is dropped, at once if it is open. Every node has one advertised address, so this is
how a partition between groups of nodes is cut: each node's proxy blocks the other group's
keys. ``heal()`` lifts blocks too.

``refuse_paths(paths)`` refuses only some sync operations: while it is in force, the proxy
reads each request of a connection (request line and Content-Length) and drops the
connection when a request's path is one of ``paths`` (``/sync/v1/pull``, ``/sync/v1/push``),
before the node sees it; other requests (``/sync/v1/feeds``) go through. So both sides learn
each other's feed positions and neither can move an entry. ``heal()`` lifts it too.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable

_HEAD_LIMIT = 64 * 1024  # the header block of the first request is looked for in this many bytes
_HEAD_TIMEOUT_S = 10.0


def _caller(head: bytes) -> str | None:
    """The ``memmesh-key`` header of the first request in ``head`` (None if there is none)."""
    block = head.split(b"\r\n\r\n", 1)[0]
    for line in block.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"memmesh-key":
            return value.strip().decode("ascii", "replace")
    return None


def _header_value(head: bytes, name: bytes) -> str | None:
    for line in head.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip().decode("ascii", "replace")
    return None


class Proxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._cut = False
        self._blocked: frozenset[str] = frozenset()
        self._refused_paths: frozenset[str] = frozenset()
        self.refused_requests = 0  # requests dropped by refuse_paths
        self._writers: set[asyncio.StreamWriter] = set()
        self._callers: dict[asyncio.StreamWriter, str | None] = {}  # client side writer -> caller key
        self._pairs: dict[asyncio.StreamWriter, asyncio.StreamWriter] = {}  # client side -> node side
        self._lock = threading.Lock()
        self.bytes_up = 0
        self.bytes_down = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def start(self) -> int:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        self.port = fut.result(5)
        return self.port

    async def _start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.close()
            return
        # The first request's header block names the caller (if it is a sync request).
        head = b""
        try:
            while b"\r\n\r\n" not in head and len(head) < _HEAD_LIMIT:
                data = await asyncio.wait_for(reader.read(65536), _HEAD_TIMEOUT_S)
                if not data:
                    break
                head += data
        except (TimeoutError, ConnectionError, OSError):
            writer.close()
            return
        caller = _caller(head)
        if self._cut or (caller is not None and caller in self._blocked):
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        self._callers[writer] = caller
        self._pairs[writer] = up_writer
        self.connections += 1

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, first: bytes, up: bool) -> None:
            try:
                data = first
                while True:
                    if data:
                        if self._cut:
                            break
                        with self._lock:
                            if up:
                                self.bytes_up += len(data)
                            else:
                                self.bytes_down += len(data)
                        dst.write(data)
                        await dst.drain()
                    data = await src.read(65536)
                    if not data:
                        break
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        async def requests(src: asyncio.StreamReader, dst: asyncio.StreamWriter, first: bytes) -> None:
            # One request at a time: its head, then Content-Length bytes of body.
            buf = first
            try:
                while True:
                    while b"\r\n\r\n" not in buf:
                        data = await src.read(65536)
                        if not data:
                            return
                        buf += data
                    head_end = buf.index(b"\r\n\r\n") + 4
                    path = buf.split(b" ", 2)[1].decode("ascii", "replace") if buf.count(b" ") >= 2 else ""
                    length = int(_header_value(buf[:head_end], b"content-length") or 0)
                    while len(buf) < head_end + length:
                        data = await src.read(65536)
                        if not data:
                            return
                        buf += data
                    if self._cut or path in self._refused_paths:
                        self.refused_requests += 1
                        writer.close()
                        return
                    request, buf = buf[:head_end + length], buf[head_end + length:]
                    with self._lock:
                        self.bytes_up += len(request)
                    dst.write(request)
                    await dst.drain()
            except (ConnectionError, OSError, ValueError):
                pass
            finally:
                dst.close()

        up = requests(reader, up_writer, head) if self._refused_paths else pipe(reader, up_writer, head, True)
        await asyncio.gather(up, pipe(up_reader, writer, b"", False))
        self._writers -= {writer, up_writer}
        self._callers.pop(writer, None)
        self._pairs.pop(writer, None)

    def _call(self, fn) -> None:
        """Run ``fn`` on the proxy's loop and return once it has run (the change is in effect)."""
        done = threading.Event()

        def do() -> None:
            try:
                fn()
            finally:
                done.set()
        self._loop.call_soon_threadsafe(do)
        done.wait(5)

    def cut(self) -> None:
        def do() -> None:
            self._cut = True
            for w in list(self._writers):
                w.close()
        self._call(do)

    def block(self, keys: Iterable[str]) -> None:
        """Refuse the callers whose sync requests are signed by ``keys`` (``ed25519:...``); their
        open connections are dropped. Replaces the previous set; ``block(())`` lifts it."""
        blocked = frozenset(keys)

        def do() -> None:
            self._blocked = blocked
            for w, caller in list(self._callers.items()):
                if caller is not None and caller in blocked:
                    w.close()
                    up = self._pairs.get(w)
                    if up is not None:
                        up.close()
        self._call(do)

    def refuse_paths(self, paths: Iterable[str]) -> None:
        """Drop requests for these paths (e.g. ``/sync/v1/pull``), let the others through; open
        connections are dropped so that every later request is looked at. ``refuse_paths(())``
        lifts it."""
        refused = frozenset(paths)

        def do() -> None:
            self._refused_paths = refused
            for w in list(self._writers):
                w.close()
        self._call(do)

    def heal(self) -> None:
        def do() -> None:
            self._cut = False
            self._blocked = frozenset()
            self._refused_paths = frozenset()
        self._call(do)

    def counts(self) -> dict[str, int]:
        """Bytes forwarded so far each way, and connections opened (since the last reset)."""
        with self._lock:
            return {"bytes_up": self.bytes_up, "bytes_down": self.bytes_down, "connections": self.connections}

    def reset_counts(self) -> None:
        with self._lock:
            self.bytes_up = self.bytes_down = self.connections = 0

    def retarget(self, port: int) -> None:
        """A restarted node listens on a new port: forward there from now on."""
        self._call(lambda: setattr(self, "target_port", port))

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                w.close()
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
