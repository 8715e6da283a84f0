"""No one who can open a socket can stall or exhaust a node, or write into its log what it likes.

Real serve processes on 127.0.0.1 (connections come from other loopback addresses, 127.0.0.2
and up, when a test needs distinct sources), with the limits lowered through their environment
variables (node/listeners.py) so that nothing waits long. Every loop is bounded in count and time.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import resource
import socket
import subprocess
import sys
from collections.abc import Iterator
from unittest import mock

import pytest

from memmesh.node.conn_limits import Limits, LimitsError
from memmesh.node.control import SERVE_JSON, SERVE_SOCK
from memmesh.node.logthrottle import RepeatFilter
from memmesh.node.serve_log import LogFormatter
from tests import procs
from tests.procs import CLI, Serve, processes, until

FAST = {"MEMMESH_HEAD_TIMEOUT_S": "2", "MEMMESH_MAX_CONNECTIONS_PER_SOURCE": "4"}
WAIT_S = 30.0  # generous: the machine is loaded; nothing here asserts on elapsed time

# Requests HTTP cannot parse, each of which logged a traceback before.
MALFORMED = [b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
             b"GET /\x00 HTTP/1.1\r\nHost: x\r\n\r\n", b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
             b"POST /sync/v1/push HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"]
EVIL_PATH = b"GET /sync/v1/%0d%1b[2K HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


@pytest.fixture
def fast(monkeypatch) -> None:
    for name, value in FAST.items():
        monkeypatch.setenv(name, value)  # inherited by the serve processes started in the test


def _port(server: Serve, which: str) -> int:
    return int(server.info[which].rsplit(":", 1)[1])


def _connect(port: int, source: str = "127.0.0.1", first: bytes = b"") -> socket.socket:
    s = socket.socket()
    try:
        s.bind((source, 0))
        s.settimeout(5)
        s.connect(("127.0.0.1", port))
        if first:
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):  # already cut (a loaded
                s.sendall(first)  # machine paused us past the head timeout): _closed() says so
        s.setblocking(False)
    except BaseException:
        s.close()
        raise
    return s


def _closed(s: socket.socket) -> bool:
    """The server closed (or reset) this connection; False while it is still open."""
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def _answered(s: socket.socket) -> bool:
    """Some of an answer has come on this (still open) connection."""
    try:
        return bool(s.recv(65536))
    except BlockingIOError:
        return False


def _exchange(port: int, request: bytes) -> bytes:
    """Send ``request`` and read until the server closes (or resets): what came back."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as s:
        s.sendall(request)  # no half-close: asyncio would close the whole connection on it
        out = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                out += chunk
        return out


@contextlib.contextmanager
def _sockets() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    try:
        yield held
    finally:
        for s in held:
            s.close()


# ---------------------------------------------------------------------- the pieces alone
def test_control_characters_are_escaped_in_every_field_text_and_json():
    record = logging.LogRecord("memmesh.serve", logging.INFO, __file__, 1, "request\r", (), None)
    record.fields = {"op": "\r\x1b[2K", "peer": "a\x9bb", "k\x1b": "\u202eevil", "ok": "plain"}
    text = LogFormatter(False).format(record)
    assert not any(c in text for c in "\r\n\x1b\x9b\u202e"), repr(text)
    assert 'op="\\r\\u001b[2K"' in text and "ok=plain" in text
    as_json = LogFormatter(True).format(record)
    assert not any(c in as_json for c in "\r\n\x1b\x9b\u202e"), repr(as_json)
    assert json.loads(as_json)["op"] == "\r\x1b[2K" and json.loads(as_json)["peer"] == "a\x9bb"


def test_a_peers_fault_logged_by_aiohttp_is_one_line_without_a_traceback():
    from aiohttp.http_exceptions import BadHttpMessage

    for exc in (BadHttpMessage("Invalid header token:\r\n\x1b[2K"), ConnectionResetError("Connection lost")):
        try:
            raise exc
        except type(exc):
            record = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "Error handling request from %s",
                                       ("127.0.0.1",), sys.exc_info())
        for fmt in (LogFormatter(False), LogFormatter(True)):
            line = fmt.format(record)
            assert "Traceback" not in line and "\n" not in line and "\x1b" not in line and type(exc).__name__ in line


def test_repeats_are_written_once_per_interval_with_a_count():
    now = [0.0]
    f = RepeatFilter(interval_s=10, clock=lambda: now[0])

    def rec(msg: str, name: str = "asyncio", **extra: object) -> logging.LogRecord:
        r = logging.LogRecord(name, logging.ERROR, __file__, 1, msg, ("x",), None)
        r.__dict__.update(extra)
        return r

    assert [f.filter(rec("socket.accept() out of system resource %s")) for _ in range(1000)].count(True) == 1
    assert f.filter(rec("another message %s"))  # another key
    assert f.filter(rec("config %s", name="memmesh.serve"))  # memmesh's own unless it asks: always written
    assert f.filter(rec("config %s", name="memmesh.serve"))
    assert [f.filter(rec("x", name="memmesh.serve", throttle="refused sync")) for _ in range(5)].count(True) == 1
    now[0] = 11.0
    owed = f.flush()
    assert sorted(r.repeated for r in owed) == [4, 999]
    assert f.filter(rec("socket.accept() out of system resource %s"))  # a new interval


def test_limits_come_from_the_environment_and_bad_values_are_refused():
    got = Limits.from_env({"MEMMESH_HEAD_TIMEOUT_S": "2.5", "MEMMESH_MAX_CONNECTIONS": "64"})
    assert got.head_timeout_s == 2.5 and got.per_listener == 64 and got.per_source == 32
    assert got.within(16).per_listener == 16 and got.within(16).per_source == 16
    for bad in ("0", "-1", "ten", "nan", "inf"):
        with pytest.raises(LimitsError, match="MEMMESH_MAX_CONNECTIONS_PER_SOURCE should be"):
            Limits.from_env({"MEMMESH_MAX_CONNECTIONS_PER_SOURCE": bad})


# ---------------------------------------------------------------------- a real serve
@pytest.mark.slow
def test_slow_headers_are_cut_and_one_source_cannot_take_a_listener(home, fast):
    with processes() as ps, _sockets() as held:
        s = ps.serve(home).start().wait_ready()
        sync, api = _port(s, "listen"), _port(s, "api")
        # 1. A request head sent a byte now and then is never completed: cut after the head timeout.
        slow = [_connect(port, first=b"GET /v1/health HTTP/1.1\r\nHo") for port in (sync, api, sync, api)]
        held += slow
        until(lambda: all(_closed(c) for c in slow), WAIT_S, "the slow-header connections to be closed")
        # 2. One source holds its 4 connections (idle between requests, within the keep-alive time);
        # its next ones are closed at once, while another client is still answered.
        mine = [_connect(sync, "127.0.0.3", b"GET /nothing HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") for _ in range(4)]
        held += mine
        # Reading an answer consumes it: a connection answered on an earlier poll stays answered.
        answered: set[int] = set()

        def all_answered() -> bool:
            answered.update(i for i, c in enumerate(mine) if i not in answered and _answered(c))
            return len(answered) == len(mine)

        until(all_answered, WAIT_S, "answers on the four kept-alive connections")
        extra = [_connect(sync, "127.0.0.3") for _ in range(3)]
        held += extra
        until(lambda: all(_closed(c) for c in extra), WAIT_S, "connections over the per-source cap to be closed")
        assert "connection.refused listener=sync peer=127.0.0.3 reason=\"per-source cap (4 connections)\"" in s.log()
        assert not any(_closed(c) for c in mine)  # the ones it holds are untouched
        answer = _exchange(sync, b"GET /sync/v1/hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 "), answer
        assert s.run("status", {}).exit_code == 0


@pytest.mark.slow
def test_malformed_requests_log_a_bounded_number_of_escaped_lines(home, fast):
    with processes() as ps:
        s = ps.serve(home).start().wait_ready()
        sync, api = _port(s, "listen"), _port(s, "api")
        before = len(s.log().splitlines())
        for _ in range(20):  # 240 malformed requests and aborted connections
            for bad in MALFORMED:
                assert _exchange(sync if bad.startswith(b"POST") else api, bad).startswith(b"HTTP/1."), bad
                assert _exchange(sync, bad).startswith(b"HTTP/1.")
        for _ in range(20):  # connections dropped mid-head
            _connect(sync, first=b"GET /sync/v1/hel").close()
        # (the dropped ones may still count against 127.0.0.1's cap for a moment: ask until answered)
        until(lambda: _exchange(sync, EVIL_PATH).startswith(b"HTTP/1.1 404"), WAIT_S, "an answer to the evil path")
        until(lambda: "\\u001b[2K" in s.log(), WAIT_S, "the evil path's request line")
        log = s.log()
        added = log.splitlines()[before:]
        assert "Traceback" not in log, log
        assert len(added) <= 2 * len(MALFORMED) + 4, "\n".join(added)  # a line per kind, not per request
        raw = s.logs[-1].read_bytes()
        assert b"\r" not in raw and b"\x1b" not in raw, raw[-2000:]
        assert 'op="\\r\\u001b[2K"' in log


@pytest.mark.slow
def test_with_log_json_every_line_is_json_even_after_a_kill_9(home, fast):
    with processes() as ps:
        s = ps.serve(home, extra=["--log-json"]).start().wait_ready()
        sync = _port(s, "listen")
        for bad in MALFORMED:
            _exchange(sync, bad)
        _exchange(sync, EVIL_PATH)
        slow = _connect(sync, first=b"GET / HTTP/1.1\r\n")
        until(lambda: _closed(slow), WAIT_S, "the slow header to be cut")
        slow.close()
        dead = s.proc.pid
        s.kill()  # kill -9: serve.json and serve.sock stay behind
        assert (home / SERVE_JSON).exists() and (home / SERVE_SOCK).exists()
        s.start().wait_ready()
        until(lambda: '"event": "ready"' in s.log(), WAIT_S, "the restarted serve to be ready")
        assert s.stop() == 0
        lines = [line for p in s.logs for line in p.read_text().splitlines()]
        events = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except ValueError:
                raise AssertionError(f"not JSON: {line!r}") from None
        assert all(isinstance(e, dict) and {"ts", "level", "event"} <= set(e) for e in events)
        assert any(e["event"] == "stale" and e["pid"] == dead for e in events)
        assert any(e["event"] == "request" and e["op"] == "\r\x1b[2K" for e in events)
        assert any(e.get("logger") == "aiohttp.server" for e in events)  # the library's lines too
        assert b"\x1b" not in b"".join(p.read_bytes() for p in s.logs)


def _few_fds() -> None:  # in the serve process, before it runs: what `ulimit -n 256` does
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


@pytest.mark.slow
def test_the_cli_stays_answerable_while_stalled_connections_exhaust_the_network_side(home):
    real = subprocess.Popen
    with processes() as ps, _sockets() as held:
        s = ps.serve(home)
        with mock.patch.object(procs.subprocess, "Popen",
                               lambda *a, **kw: real(*a, preexec_fn=_few_fds, **kw)):
            s.start()
        s.wait_ready()
        sync, api = _port(s, "listen"), _port(s, "api")
        # More stalled connections than the process has descriptors, from ten sources.
        for i in range(300):
            with contextlib.suppress(OSError):  # refused at once: the point
                held.append(_connect(sync if i % 2 else api, f"127.0.0.{2 + i % 10}", b"GET / HTTP/1.1\r\nHo"))
        status = subprocess.run([*CLI, "--home", str(home), "status"], capture_output=True, text=True,
                                timeout=60)
        assert status.returncode == 0, status.stderr
        assert s.run("status", {}).exit_code == 0
        log = s.log()
        assert len(log.splitlines()) < 60, log[-3000:]  # once per interval, never per event
        assert "out of system resource" not in log


class _NoDescriptors(socket.socket):
    """A listening socket whose accept() fails as it does when the process has no descriptor left."""

    calls = 0

    def accept(self):  # type: ignore[override]
        type(self).calls += 1
        raise OSError(errno.EMFILE, "Too many open files")


def test_out_of_descriptors_pauses_accepting_instead_of_spinning(caplog):
    from aiohttp import web

    from memmesh.node.listeners import GuardedSite

    async def scenario() -> None:
        runner = web.AppRunner(web.Application(), access_log=None)
        await runner.setup()
        sock = _NoDescriptors(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        site = GuardedSite(runner, sock, Limits(), "sync")
        await site.start()
        clients = [socket.create_connection(sock.getsockname()[:2], timeout=5) for _ in range(3)]
        try:
            for _ in range(20):  # some loop iterations while connections wait in the backlog
                await asyncio.sleep(0.01)
        finally:
            for c in clients:
                c.close()
            await runner.cleanup()

    with caplog.at_level(logging.INFO, logger="memmesh.serve"):
        asyncio.run(scenario())
    assert _NoDescriptors.calls == 1  # then paused (1 s), not retried per loop iteration
    paused = [r for r in caplog.records if r.getMessage() == "accept.paused"]
    assert len(paused) == 1 and paused[0].fields["error"] == "EMFILE"
