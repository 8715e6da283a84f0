"""Helpers for tests that run real `memmesh serve` processes on 127.0.0.1 (loopback only).

* ``Serve``: one serve process for a home; started again after a stop or a ``kill -9`` (same
  home, a new port); ready only once serve.json names *this* process (a killed serve leaves
  its stale serve.json behind); its log in a file beside the home, one per start.
* ``Processes``: everything a test started, killed in its ``finally`` (``processes()``).
* ``LinkProxy``: tests/faultproxy.py's proxy in front of one node (cut, heal, retarget, block
  callers by their ``memmesh-key``: one connection carries one client's requests). Every node
  advertises one address, so blocking callers is how a node is isolated in both directions
  while it keeps running.
* ``until``: poll with a deadline; nothing sleeps a fixed time to "let things settle".
"""
from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from memmesh.node.commands.result import Result
from memmesh.node.control import SERVE_JSON, SERVE_SOCK, ControlClient, _UnixConnection
from tests.faultproxy import Proxy

CLI = [sys.executable, "-m", "memmesh.node.cli"]
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
    def start(self) -> Serve:
        assert not self.running(), "serve is already running"
        self._close_log()
        path = self.home.parent / f"{self.home.name}-serve-{len(self.logs)}.log"
        self.logs.append(path)
        self._log = open(path, "w")  # noqa: SIM115 (serve writes it until _close_log)
        args = [*CLI, "--home", str(self.home), "serve", "--listen", self.listen, "--interval", f"{self.interval:g}",
                "--api-listen", "127.0.0.1:0"]  # any free port: tests run many serves at once
        if not self.discovery:
            args.append("--no-discovery")
        if self.advertise:
            args += ["--advertise", self.advertise]
        self.info = {}
        self.proc = subprocess.Popen(args + self.extra, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self._log)
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> Serve:
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


class LinkProxy(Proxy):
    """The fault proxy of tests/faultproxy.py in front of one node, started before the node (its
    port is what the node advertises; ``retarget`` points it at the node once it listens)."""

    def __init__(self, target_port: int = 0) -> None:
        super().__init__(target_port)

    @property
    def address(self) -> str:
        return f"http:127.0.0.1:{self.port}"


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
