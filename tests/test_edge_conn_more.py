"""Connections again, with the cases an adversary tries next: every request timed (its head from
its first byte, its body from its head), whatever the route; floods of well-formed requests
folded in the log; the control socket kept open to the CLI while a local script stalls it.

Real serve processes on 127.0.0.1 with lowered limits (node/listeners.py's environment
variables), bounded loops, no assertion on elapsed time.
"""
from __future__ import annotations

import contextlib
import json
import logging
import resource
import socket
import subprocess
from unittest import mock

import pytest

from memmesh.node.control import SERVE_SOCK
from memmesh.node.logthrottle import RepeatFilter
from memmesh.node.request_timing import RequestFramer
from tests import procs
from tests.procs import CLI, processes, until
from tests.test_edge_connections import _closed, _connect, _port

WAIT_S = 30.0
# The head and body timers short, the keep-alive long: whatever cuts a connection in these tests
# is a request timer, never aiohttp's idle timer.
TIMERS = {"MEMMESH_HEAD_TIMEOUT_S": "2", "MEMMESH_BODY_TIMEOUT_S": "2", "MEMMESH_KEEPALIVE_S": "120"}


def _drip(s: socket.socket, data: bytes, sent: dict[int, int]) -> bool:
    """Send the next byte of ``data`` (cycled; ``sent`` counts per socket); True once the server
    has closed the connection."""
    if _closed(s):
        return True
    n = sent.get(s.fileno(), 0)
    with contextlib.suppress(BlockingIOError):
        try:
            s.send(data[n % len(data):n % len(data) + 1])
        except OSError:
            return True
    sent[s.fileno()] = n + 1
    return False


# ---------------------------------------------------------------------- the pieces alone
def _phases(*chunks: bytes) -> list[tuple[str, int]]:
    f = RequestFramer()
    out = []
    for c in chunks:
        f.feed(c)
        out.append(("head+" if f.in_head else "body" if f.in_body else f.phase, f.requests))
    return out


def test_the_framer_finds_where_heads_and_bodies_end():
    get = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    assert _phases(get * 50) == [("head", 50)]  # pipelined: all framed, nothing owed
    assert _phases(b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab", b"cde", b"GE") == [
        ("body", 1), ("head", 1), ("head+", 1)]
    assert _phases(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n3;x=y\r\nabc\r\n",
                   b"0\r\nTrailer: t\r\n", b"\r\n" + get) == [("body", 1), ("body", 1), ("head", 2)]
    assert _phases(b"POST / HTTP/1.1\nContent-Length: 2\n\nab" + get) == [("head", 2)]  # bare LFs
    assert _phases(b"\r\n" + get) == [("head", 1)]
    assert _phases(b"GET /" + b"a" * 20_000) == [("lost", 0)]  # aiohttp refuses it: framing stops
    assert _phases(b"POST / HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n") == [("lost", 1)]


def test_a_burst_allowance_writes_a_few_of_a_kind_then_folds():
    now = [0.0]
    f = RepeatFilter(interval_s=10, clock=lambda: now[0])

    def rec() -> logging.LogRecord:
        r = logging.LogRecord("memmesh.serve", logging.INFO, __file__, 1, "request", (), None)
        r.throttle, r.throttle_burst = "request push 401", 10
        return r

    assert [f.filter(rec()) for _ in range(10_000)].count(True) == 10
    now[0] = 11.0
    assert [r.repeated for r in f.flush()] == [9_990]


# ---------------------------------------------------------------------- a real serve
@pytest.mark.slow
def test_every_request_is_timed_its_body_and_a_later_head_too(home, monkeypatch):
    for name, value in TIMERS.items():
        monkeypatch.setenv(name, value)
    with processes() as ps, contextlib.ExitStack() as stack:
        s = ps.serve(home).start().wait_ready()
        sync, api = _port(s, "listen"), _port(s, "api")
        token = (home / "api.token").read_text().strip()
        auth = f"Host: 127.0.0.1:{api}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        health = f"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1:{api}\r\n\r\n".encode()
        dripped = {
            # a body a byte at a time, to a route that reads it without a timer of its own
            "api body": (api, f"POST /v1/memory/new HTTP/1.1\r\n{auth}Content-Length: 100000\r\n\r\n".encode(), b" "),
            # a chunked body that never ends
            "api chunked": (api, f"POST /v1/memory/new HTTP/1.1\r\n{auth}Transfer-Encoding: chunked\r\n\r\n".encode(),
                            b"1\r\n \r\n"),
            # a first head a byte at a time (each byte resets nothing)
            "sync first head": (sync, b"G", b"ET /sync/v1/hello HTTP/1.1\r\nX-Pad: y\r\n"),
            # a second request on a kept-alive connection, its head a byte at a time
            "api second head": (api, health, health),
            "sync second head": (sync, b"POST /sync/v1/hello HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
                                 b"POST /sync/v1/hello HTTP/1.1\r\n"),
        }
        held = {}
        for what, (port, first, _) in dripped.items():
            held[what] = stack.enter_context(contextlib.closing(_connect(port, first=first)))
        # Expect: 100-continue, then never the body
        expect = f"POST /v1/memory/new HTTP/1.1\r\n{auth}Expect: 100-continue\r\nContent-Length: 10\r\n\r\n"
        held["api expect"] = stack.enter_context(contextlib.closing(_connect(api, first=expect.encode())))
        sent: dict[int, int] = {}
        # A list, not a generator: every connection drips its byte each round, whatever the first answers.
        until(lambda: all([_drip(held[w], dripped[w][2], sent) if w in dripped else _closed(held[w]) for w in held]),  # noqa: C419
              WAIT_S, lambda: "closed: " + ", ".join(w for w in held if _closed(held[w])), interval=0.2)
        log = s.log()
        assert "the request body was not complete 2 s after its head" in log, log
        assert "Traceback" not in log and "status=500" not in log, log
        assert s.run("status", {}).exit_code == 0


@pytest.mark.slow
def test_a_flood_of_well_formed_requests_writes_a_bounded_log_of_json_lines(home):
    with processes() as ps:
        s = ps.serve(home, extra=["--log-json"]).start().wait_ready()
        sync, api = _port(s, "listen"), _port(s, "api")
        before = len(s.log().splitlines())
        floods = [(api, f"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1:{api}\r\n\r\n".encode()),
                  (api, f"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1:{api}\r\n\r\n".encode()),  # 401
                  (api, f"GET /nope%1b[2K%0d HTTP/1.1\r\nHost: 127.0.0.1:{api}\r\n\r\n".encode()),
                  (sync, b"POST /sync/v1/hello HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"),
                  (sync, b"GET /sync/v1/%1b%0d%00 HTTP/1.1\r\nHost: x\r\nmemmesh-key: k%1b\r\n\r\n")]
        answers = 0
        for port, request in floods:  # 2,500 requests, 500 pipelined in each of five writes
            with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as c:
                c.sendall(request * 500)
                got = b""
                while got.count(b"HTTP/1.1 ") < 500:
                    chunk = c.recv(1 << 20)
                    if not chunk:
                        break
                    got += chunk
                answers += got.count(b"HTTP/1.1 ")
        assert answers == 2500
        # Raw control bytes in a header (aiohttp may refuse them: a line of its own, escaped).
        for head in (b"memmesh-key: k\x1b[2K\x7f\x9b", b"User-Agent: \x1b]0;owned\x07", b"X-A: \x00\x08\r\x0b"):
            for port in (sync, api):
                with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as c:
                    c.sendall(b"POST /sync/v1/push HTTP/1.1\r\nHost: x\r\n" + head + b"\r\nContent-Length: 0\r\n\r\n")
                    assert c.recv(100).startswith(b"HTTP/1.")
        # A local script looping on the control socket: an unknown command, and a client that
        # leaves before its answer (the CLI's own commands are lines like these).
        for i in range(200):
            with contextlib.closing(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)) as c:
                c.settimeout(WAIT_S)
                c.connect(str(home / SERVE_SOCK))
                body = json.dumps({"name": "no\x1b[2Ksuch" if i % 2 else "nothing.here", "params": {}}).encode()
                c.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                assert c.recv(100).startswith(b"HTTP/1.1 200")
        assert s.run("status", {}).exit_code == 0
        assert s.stop() == 0
        raw = s.logs[-1].read_bytes()
        lines = raw.decode().splitlines()
        added = lines[before:]
        assert len(added) < 150, "\n".join(added[-40:])  # before: a line per request, 2,500
        assert all(isinstance(json.loads(line), dict) for line in lines)
        assert not any(b < 0x20 and b != 0x0A for b in raw), raw[-2000:]
        assert any(json.loads(line).get("repeated", 0) >= 400 for line in added)
        control = [e for e in map(json.loads, added) if e["event"].startswith("control")]
        assert len(control) < 60, control[-10:]  # before: one or two lines per call, 200 to 400


def _few_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


@pytest.mark.slow
def test_stalled_local_connections_cannot_lock_the_cli_out_of_the_control_socket(home):
    real = subprocess.Popen
    with processes() as ps, contextlib.ExitStack() as stack:
        s = ps.serve(home)
        with mock.patch.object(procs.subprocess, "Popen", lambda *a, **kw: real(*a, preexec_fn=_few_fds, **kw)):
            s.start()
        s.wait_ready()
        # More stalled connections than the control socket takes ((256 - 128) / 3 = 42): half
        # never send a request, half stop in the middle of their body.
        for i in range(60):
            c = stack.enter_context(contextlib.closing(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)))
            c.settimeout(5)
            c.connect(str(home / SERVE_SOCK))
            if i % 2:
                c.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        status = subprocess.run([*CLI, "--home", str(home), "status"], capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        assert "connection.evicted listener=control" in s.log()


@pytest.mark.slow
def test_the_mcp_http_transport_cuts_stalled_connections_and_serve_stays_answerable(home, tmp_path, monkeypatch):
    monkeypatch.setenv("MEMMESH_HEAD_TIMEOUT_S", "2")
    with processes() as ps, contextlib.ExitStack() as stack:
        s = ps.serve(home).start().wait_ready()
        assert s.run("agent.new", {"name": "alpha"}).exit_code == 0
        err = tmp_path / "mcp.err"
        proc = subprocess.Popen([*CLI, "--home", str(home), "mcp", "--agent", "alpha", "--http", "--listen",
                                 "127.0.0.1:0"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=stack.enter_context(open(err, "w")))
        stack.callback(proc.wait, 10)
        stack.callback(proc.kill)
        url = until(lambda: next((w for w in err.read_text().split() if w.endswith("/mcp")), None), WAIT_S,
                    lambda: f"memmesh mcp --http to listen: {err.read_text()}")
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        # More stalled heads than its 64 concurrent connections: all cut by the head timer
        # (before: held for good, and every later client answered 503).
        stalled = [stack.enter_context(contextlib.closing(
            _connect(port, f"127.0.0.{2 + i % 20}", b"POST /mcp HTTP/1.1\r\nHo"))) for i in range(80)]
        assert s.run("status", {}).exit_code == 0  # serve and its control socket are another matter
        until(lambda: all(_closed(c) for c in stalled), WAIT_S, "the stalled MCP connections to be cut")
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as c:
            c.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n\r\n".encode())
            assert c.recv(100).startswith(b"HTTP/1.1 401"), "answered, not 503"


async def test_an_event_subscriber_that_never_reads_holds_a_bounded_buffer():
    import asyncio

    from aiohttp.test_utils import TestServer

    from memmesh.node.api.app import build_app
    from memmesh.node.api.live import Live
    from memmesh.node.events import EventBus

    bus = EventBus()
    bus.attach(asyncio.get_running_loop())

    async def run(name: str, params: dict) -> None:
        raise AssertionError("no command runs here")

    token = "t" * 43
    server = TestServer(build_app(run, token, live=Live(bus, "ed25519:k")), host="127.0.0.1", port=0)
    await server.start_server()
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(f"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                     f"Authorization: Bearer {token}\r\n\r\n".encode())

        def buffered() -> list[int]:  # what the server holds for the client, per connection
            return [h.transport.get_write_buffer_size() for h in server.runner.server.connections  # type: ignore
                    if h.transport is not None]

        for _ in range(250):  # until the stream is open and following the bus
            if buffered() and bus._waiters:
                break
            await asyncio.sleep(0.02)
        for i in range(bus.capacity):  # a full ring of 1 KB events at once, to a client that reads nothing
            bus.publish("peer.connected", {"peer": f"{i:06d}" + "x" * 1000, "db": "d"})
        most = 0
        for _ in range(50):
            await asyncio.sleep(0.02)
            most = max([most, *buffered()])
        assert 0 < most < 2 * 1024 * 1024, most  # before: the whole ring, 10 MB, in one write
    finally:
        sock.close()
        bus.close()
        await server.close()
