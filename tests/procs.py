"""Helpers for tests that run real `memmesh serve` processes on 127.0.0.1 (loopback only).

* ``Serve``: one serve process for a home; started again after a stop or a ``kill -9`` (same
  home, a new port); ready only once serve.json names *this* process (a killed serve leaves
  its stale serve.json behind); its log in a file beside the home, one per start.
* ``Processes``: everything a test started, killed in its ``finally`` (``processes()``).
* ``LinkProxy``: a fault-injecting TCP proxy in front of one node (cut, heal, retarget, as
  tests/faultproxy.py) that can also cut single directed links: it reads the first request
  head of each connection and drops the connection when the caller's ``memmesh-key`` is
  blocked (one connection carries one client's requests). Every node advertises one address,
  so this is how a node is isolated in both directions while it keeps running.
* ``until``: poll with a deadline; nothing sleeps a fixed time to "let things settle".
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

from node.commands.result import Result
from node.control import SERVE_JSON, SERVE_SOCK, ControlClient, _UnixConnection

CLI = [sys.executable, "-m", "node.cli"]
START_TIMEOUT_S = 30.0  # a cold interpreter importing memmesh on a loaded 2-core machine
STOP_TIMEOUT_S = 20.0  # serve drains for up to 10 s (DRAIN_S)
T = TypeVar("T")


def until(predicate: Callable[[], T], timeout: float, what: str | Callable[[], str], interval: float = 0.05) -> T:
    """Poll ``predicate`` until it returns something truthy (returned); AssertionError naming
    ``what`` (a string or a function giving one) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what() if callable(what) else what}")
        time.sleep(interval)


class Serve:
    """`memmesh --home HOME serve ...` as a user runs it, logs to a file."""

    def __init__(self, home: Path, *, interval: float = 1.0, discovery: bool = False, listen: str = "127.0.0.1:0",
                 advertise: str | None = None, extra: Iterable[str] = ()) -> None:
        self.home = Path(home)
        self.interval = interval
        self.discovery = discovery
        self.listen = listen
        self.advertise = advertise
        self.extra = list(extra)
        self.proc: subprocess.Popen | None = None
        self.info: dict[str, Any] = {}
        self.logs: list[Path] = []
        self._log: Any = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "Serve":
        assert not self.running(), "serve is already running"
        self._close_log()
        path = self.home.parent / f"{self.home.name}-serve-{len(self.logs)}.log"
        self.logs.append(path)
        self._log = open(path, "w")
        args = [*CLI, "--home", str(self.home), "serve", "--listen", self.listen, "--interval", f"{self.interval:g}"]
        if not self.discovery:
            args.append("--no-discovery")
        if self.advertise:
            args += ["--advertise", self.advertise]
        self.info = {}
        self.proc = subprocess.Popen(args + self.extra, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self._log)
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> "Serve":
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve for {self.home} exited with {self.proc.returncode}: {self.log()}")
            try:
                info = json.loads((self.home / SERVE_JSON).read_text())
            except (FileNotFoundError, ValueError):
                info = {}
            if info.get("pid") == self.proc.pid:  # not a killed serve's stale file
                self.info = info
                return self
            if time.monotonic() >= deadline:
                raise AssertionError(f"serve for {self.home} did not start in {timeout:g} s: {self.log()}")
            time.sleep(0.02)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int:
        """Stop it (gracefully by default); its exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self._close_log()

    def kill(self) -> None:
        """kill -9: no clean-up at all (serve.json and serve.sock stay behind)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._close_log()

    close = kill

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    # ------------------------------------------------------------------ what it says
    @property
    def port(self) -> int:
        return int(self.info["listen"].rsplit(":", 1)[1])

    @property
    def address(self) -> str:
        return self.info["address"]

    @property
    def node_key(self) -> str:
        return self.info["node_key"]

    def log(self, every: bool = False) -> str:
        """The current start's log (every start's with ``every``)."""
        if self._log is not None:
            self._log.flush()
        paths = self.logs if every else self.logs[-1:]
        return "\n".join(p.read_text(errors="replace") for p in paths if p.exists())

    # ------------------------------------------------------------------ its control channel
    def client(self) -> ControlClient:
        """A control client of this very process (never another, or a stale file's)."""
        assert self.info, "serve is not ready"
        conn = _UnixConnection(self.home / SERVE_SOCK)
        try:
            conn.connect()
        except BaseException:
            conn.close()
            raise
        return ControlClient(self.home, self.info, conn)

    def run(self, name: str, params: dict[str, Any]) -> Result:
        with self.client() as c:
            return c.run(name, params)

    def status(self) -> dict[str, Any]:
        with self.client() as c:
            return c.status()


def _header(head: bytes, name: bytes) -> str | None:
    for line in head.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip().decode("ascii", "replace")
    return None


class LinkProxy:
    """A TCP proxy in front of one node (127.0.0.1:port -> the node's port), in a thread with
    its own loop: ``cut()`` drops every link into the node, ``block(keys)`` only the links of
    those callers (both drop open connections at once), ``heal()`` lifts both, ``retarget()``
    follows a restarted node to its new port. Every change is in effect when the call returns.
    (tests/faultproxy.Proxy with caller blocks; standalone so that it does not depend on that
    file's internals.)"""

    def __init__(self, target_port: int = 0) -> None:
        self.target_port = target_port
        self.port = 0
        self.refused = 0  # connections dropped because the link was cut or the caller blocked
        self._cut = False
        self._blocked: frozenset[str] = frozenset()
        self._conns: dict[asyncio.StreamWriter, tuple[str | None, asyncio.StreamWriter]] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="link-proxy")
        self._server: asyncio.base_events.Server | None = None

    @property
    def address(self) -> str:
        return f"http:127.0.0.1:{self.port}"

    def start(self) -> int:
        self._thread.start()

        async def start() -> int:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            return self._server.sockets[0].getsockname()[1]
        self.port = asyncio.run_coroutine_threadsafe(start(), self._loop).result(5)
        return self.port

    def stop(self) -> None:
        if not self._thread.is_alive():
            return

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            self._drop(lambda key: True)
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _now(self, fn: Callable[[], None]) -> None:
        async def do() -> None:
            fn()
        asyncio.run_coroutine_threadsafe(do(), self._loop).result(5)

    def _drop(self, which: Callable[[str | None], bool]) -> None:
        for w, (key, up) in list(self._conns.items()):
            if which(key):
                w.close()
                up.close()

    def cut(self) -> None:
        def do() -> None:
            self._cut = True
            self._drop(lambda key: True)
        self._now(do)

    def block(self, keys: Iterable[str]) -> None:
        """Refuse these callers (their ``memmesh-key``) from now on; ``block(())`` lifts it."""
        blocked = frozenset(keys)

        def do() -> None:
            self._blocked = blocked
            self._drop(lambda key: key in blocked)
        self._now(do)

    def heal(self) -> None:
        def do() -> None:
            self._cut = False
            self._blocked = frozenset()
        self._now(do)

    def retarget(self, port: int) -> None:
        self._now(lambda: setattr(self, "target_port", port))

    def _passes(self, key: str | None) -> bool:
        return not self._cut and key not in self._blocked

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # One connection carries one client's requests: its first request head names the caller.
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, OSError):
            writer.close()
            return
        key = _header(head, b"memmesh-key")
        if not self._passes(key):
            self.refused += 1
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._conns[writer] = (key, up_writer)
        up_writer.write(head)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    if not self._passes(key):
                        break
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            self._conns.pop(writer, None)


class Processes:
    """What one test started: every serve killed, every proxy stopped, whatever happens."""

    def __init__(self) -> None:
        self.serves: list[Serve] = []
        self.proxies: list[LinkProxy] = []

    def serve(self, home: Path, **kwargs: Any) -> Serve:
        s = Serve(home, **kwargs)
        self.serves.append(s)
        return s

    def proxy(self) -> LinkProxy:
        p = LinkProxy()
        p.start()
        self.proxies.append(p)
        return p

    def close(self) -> None:
        for s in self.serves:
            with contextlib.suppress(Exception):
                s.kill()
        for p in self.proxies:
            with contextlib.suppress(Exception):
                p.stop()


@contextlib.contextmanager
def processes() -> Iterator[Processes]:
    procs = Processes()
    try:
        yield procs
    finally:
        procs.close()
