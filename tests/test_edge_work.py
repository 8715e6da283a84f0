"""What one who can open a socket can make a node hold or do (issue 19, section 4: memory, work).

On real aiohttp servers on 127.0.0.1 built as serve builds the sync app, with real keys and
signed entries: a body's decoding is bounded by what its message type can hold, a caller that
may not read a database costs no decoding, the bytes of bodies in flight are bounded across
connections, parked entries back the pusher off, a push gives the database thread back between
slices, a non-ASCII ``memmesh-time`` is a 401 and a body cut mid-stream logs one line, no 500.
"""
from __future__ import annotations

import asyncio
import logging
import random
import threading
import tracemalloc

import aiohttp
import msgpack
import pytest
from aiohttp import web

from memmesh.crdt.entry import id_to_raw
from memmesh.crdt.pending import _Ranking
from memmesh.node.serve_log import access_log as _access_log
from memmesh.node.sync import http as sync_http
from memmesh.node.sync import messages as m
from memmesh.node.sync import protocol
from memmesh.node.sync.envelope import EnvelopeError, RequestVerifier, sign_request
from memmesh.node.sync.http import BodyBudget, HttpTransport, call, run_exchange, sync_app_routes
from memmesh.node.sync.protocol import Client, Exchange, PushBackoff, SyncError, SyncServer
from memmesh.node.worker import DbThread
from tests.dbkit import craft, grant, key, new_db, replica, rows_update, write
from tests.test_sync_protocol import Node

ADMIN, WRITER, READER, STRANGER, NODE = key(1), key(2), key(41), key(43), key(42)
ORPHANS = [key(100 + i) for i in range(4)]  # never granted: their entries name made-up parents
LIMIT = m.MAX_BODY_BYTES - 1024


# ----------------------------------------------------------------------------- helpers
async def _direct(fn):
    return fn()


def _bank():
    db = new_db(ADMIN)
    grant(db, ADMIN, WRITER, "write")
    grant(db, ADMIN, READER, "read")
    write(db, WRITER, {"key": "seed", "value": "before"})
    return db


class _Served:
    def __init__(self, db, server: SyncServer, runner: web.AppRunner, port: int) -> None:
        self.db, self.server, self.runner, self.port = db, server, runner, port
        self.address = f"http:127.0.0.1:{port}"


async def _serve(db, *, run=_direct, backoff: PushBackoff | None = None, budget: BodyBudget | None = None,
                 read_timeout: float = 10.0) -> _Served:
    """The sync app as serve builds it: body cap, the access log middleware, the sync routes."""
    node = Node()
    node.dbs[db.id] = db
    server = SyncServer(NODE, node, backoff=backoff)
    app = web.Application(client_max_size=m.MAX_BODY_BYTES, middlewares=[_access_log])
    sync_app_routes(app, server, run, read_timeout=read_timeout, budget=budget)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return _Served(db, server, runner, site._server.sockets[0].getsockname()[1])


async def _post(port: int, who, op: str, body: bytes, **header_overrides: str) -> tuple[int, dict]:
    signed = sign_request(who, "POST", protocol.PREFIX + op, body, str(NODE.public), protocol._now_ms())
    headers = {**signed.headers, **header_overrides, "content-type": "application/msgpack"}
    async with (aiohttp.ClientSession() as session,
                session.post(f"http://127.0.0.1:{port}{protocol.PREFIX}{op}", data=body, headers=headers) as resp):
        return resp.status, msgpack.unpackb(await resp.read(), raw=False)


def _worst_bodies(db_raw: bytes) -> dict[str, bytes]:
    """8 MiB push bodies that cost the most to build: every byte a container."""
    per = 20_000
    return {
        "arrays of empty maps": msgpack.packb({"db": db_raw, "entries": [[{}] * per] * (LIMIT // (per + 3))}),
        "many tiny arrays": msgpack.packb({"db": db_raw, "entries": [[[]] * per] * (LIMIT // (per + 3))}),
        "deep nesting": b"\x82\xa2db\xc4\x20" + db_raw + b"\xa7entries" + b"\x91" * (LIMIT - 64) + b"\xc0",
        "entries of empty maps": msgpack.packb({"db": db_raw, "entries": [[{}, {}]] * per}),
    }


def _orphans(db, n: int, seed: int = 7) -> list[tuple[bytes, dict]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        who = ORPHANS[i % len(ORPHANS)]
        e = craft(db, who, {"memory": rows_update(who, "memory", 0, [f"orphan {i}"])},
                  parents=["sha256:" + rng.randbytes(32).hex()], seq=0, prev=None)
        out.append((e.header, dict(e.payloads)))
    return out


# ----------------------------------------------------------------------- decoding bounds
@pytest.mark.parametrize("shape", ["arrays of empty maps", "many tiny arrays", "deep nesting", "entries of empty maps"])
def test_a_worst_case_body_is_refused_with_bounded_memory(shape):
    body = _worst_bodies(b"\x01" * 32)[shape]
    assert len(body) <= m.MAX_BODY_BYTES
    tracemalloc.start()
    try:
        with pytest.raises(m.MessageError) as err:
            m.decode_request("push", body)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.value.reason == "sync.bad_message"
    # Memory, not time: refusing costs at most about one more copy of the body (the decoder's
    # buffer), never the containers the body describes (the old decoder built 576 MiB here).
    limit = 2 * len(body) + (1 << 20)
    assert peak <= limit, f"{shape}: refusing allocated {peak} bytes at peak for a {len(body)}-byte body"


async def test_worst_case_bodies_from_a_reader_get_a_clear_400():
    served = await _serve(_bank())
    try:
        for shape, body in _worst_bodies(id_to_raw(served.db.id)).items():
            status, reply = await _post(served.port, READER, "push", body)
            assert status == 400 and reply["error"] == "sync.bad_message", (shape, status, reply)
            assert reply["message"] and len(reply["message"]) < 200
    finally:
        await served.runner.cleanup()


async def test_a_stranger_push_is_refused_before_its_body_is_decoded(monkeypatch):
    decoded: list[str] = []
    real = m.decode_request
    monkeypatch.setattr(m, "decode_request", lambda op, body: (decoded.append(op), real(op, body))[1])
    served = await _serve(_bank())
    try:
        body = _worst_bodies(id_to_raw(served.db.id))["arrays of empty maps"]
        status, reply = await _post(served.port, STRANGER, "push", body)
        assert (status, reply["error"]) == (404, "sync.not_found") and decoded == []
        # The db field may come last (any order): still found without building the rest.
        late = msgpack.packb({"entries": [[{}] * 1000] * 100, "db": id_to_raw(served.db.id)})
        status, reply = await _post(served.port, STRANGER, "push", late)
        assert (status, reply["error"]) == (404, "sync.not_found") and decoded == []
        # A reader's well-formed request is decoded as before.
        status, _ = await _post(served.port, READER, "feeds", m.pack(m.FeedsRequest(served.db.id, {}).encode()))
        assert status == 200 and decoded == ["feeds"]
    finally:
        await served.runner.cleanup()


# --------------------------------------------------------------------- bytes in flight
async def _hold(port: int, length: int, sent: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /sync/v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\n"
                 b"Content-Length: %d\r\n\r\n" % length + b"\x00" * sent)
    await writer.drain()
    return reader, writer


async def test_bodies_in_flight_are_bounded_across_connections(monkeypatch):
    monkeypatch.setattr(sync_http, "BUSY_WAIT_S", 0.2)
    budget = BodyBudget(limit=4 * 1024 * 1024)
    served = await _serve(_bank(), budget=budget)
    held = []
    try:
        for _ in range(4):  # each declares 1 MiB and sends a part: the budget is then full
            held.append(await _hold(served.port, 1024 * 1024, 4096))
        for _ in range(200):
            if budget.held == budget.limit:
                break
            await asyncio.sleep(0.05)
        assert budget.held == budget.limit
        reader, writer = await _hold(served.port, 1024 * 1024, 0)  # one more body: no room
        answer = await asyncio.wait_for(reader.read(4096), timeout=10)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 503") and b"sync.busy" in answer
        assert budget.held <= budget.limit
    finally:
        for _reader, writer in held:
            writer.close()
    try:
        for _ in range(200):  # the holders went away: their bytes come back
            if budget.held == 0:
                break
            await asyncio.sleep(0.05)
        assert budget.held == 0
        status, _ = await _post(served.port, READER, "feeds", m.pack(m.FeedsRequest(served.db.id, {}).encode()))
        assert status == 200
    finally:
        await served.runner.cleanup()


# ----------------------------------------------------------------- parked entries, slices
async def test_parked_entries_back_the_pusher_off():
    db = _bank()
    backoff = PushBackoff(parked_threshold=64)
    served = await _serve(db, backoff=backoff)
    try:
        body = m.pack(m.PushRequest(db.id, _orphans(db, 200)).encode())
        status, reply = await _post(served.port, READER, "push", body)
        assert (status, reply["error"]) == (429, "sync.backoff") and "parked" in reply["message"]
        assert 64 < len(db._pending) < 200  # taken in up to the threshold, the rest not looked at
        body = m.pack(m.PushRequest(db.id, _orphans(db, 1, seed=8)).encode())
        status, reply = await _post(served.port, READER, "push", body)
        assert (status, reply["error"]) == (429, "sync.backoff")
    finally:
        await served.runner.cleanup()


async def test_an_honest_push_of_many_entries_is_not_backed_off():
    """Parents before children: a peer that pushes far more than the threshold parks none."""
    db = _bank()
    served = await _serve(db, backoff=PushBackoff(parked_threshold=16))
    mine = replica(db)
    grant(mine, ADMIN, NODE, "write")
    for i in range(150):
        write(mine, WRITER, {"key": f"k{i}", "value": "v"})
    try:
        async with aiohttp.ClientSession() as session:
            ex = Exchange(mine, str(NODE.public), page_bytes=20_000)
            await run_exchange(HttpTransport(session), Client(READER), served.address, str(NODE.public), ex, _direct)
        assert ex.stats.pushed == 151 and not ex.stats.push_refused and len(db._pending) == 0
        assert served.server.backoff.blocked_for(str(READER.public), protocol._now_ms()) == 0
    finally:
        await served.runner.cleanup()


async def test_other_database_work_is_served_between_slices_of_a_push(monkeypatch):
    """Structural: a job submitted to the database thread while a push is being ingested runs
    before the push's last slice (a status call, the control socket, another peer)."""
    monkeypatch.setattr(protocol, "SLICE_S", 0.0)  # give the thread back after every chunk
    thread = DbThread(name="memmesh-db-test")
    db = _bank()
    events: list[str] = []
    real_ingest = db.ingest

    def ingest(items, *, source=""):
        events.append("ingest")
        if events.count("ingest") == 1:  # a status call arrives from elsewhere mid-push
            t = threading.Thread(target=lambda: thread.submit(lambda: events.append("status")))
            t.start()
            t.join()
        return real_ingest(items, source=source)

    db.ingest = ingest
    served = await _serve(db, run=thread.run, backoff=PushBackoff(parked_threshold=10_000))
    try:
        entries = _orphans(db, 5 * protocol.PUSH_SLICE_ENTRIES)
        status, reply = await _post(served.port, READER, "push", m.pack(m.PushRequest(db.id, entries).encode()))
        assert status == 200 and reply["pending"] == len(entries)
        assert events.count("ingest") == 5 and "status" in events
        assert events.index("status") < len(events) - 1, events  # served before the push ended
        assert events.index("status") == 1  # right after the first slice, not at the end
    finally:
        await served.runner.cleanup()
        thread.stop()


def test_the_pending_ranking_picks_what_a_scan_would():
    """The heap that replaced the per-eviction scan (5,000 orphans took 30 s) chooses the same
    largest (value, name) as ``max`` over every name, through arbitrary changes."""
    rng = random.Random(3)
    ranking, values = _Ranking(), {}
    for _ in range(5000):
        name = f"a{rng.randrange(60)}"
        values[name] = max(0, values.get(name, 0) + rng.choice((-2, -1, 1, 1, 3)))
        ranking.set(name, values[name])
        live = {n: v for n, v in values.items() if v}
        assert ranking.top() == (max(live, key=lambda n: (live[n], n)) if live else None)
    assert len(ranking.heap) <= 4 * len(ranking.values) + 65


# ---------------------------------------------------------------------- bad input, 4xx
@pytest.mark.parametrize("text", ["²", "①", "١٢٣", "12³"])
def test_a_non_ascii_time_is_refused_as_unauthenticated(text):
    verifier = RequestVerifier(str(NODE.public))
    signed = sign_request(READER, "POST", "/sync/v1/hello", b"\x81\xa1v\x01", str(NODE.public), 1)
    with pytest.raises(EnvelopeError) as err:
        verifier.verify("POST", "/sync/v1/hello", {**signed.headers, "memmesh-time": text}, b"\x81\xa1v\x01", 1)
    assert err.value.reason == "sync.unauthenticated" and "memmesh-time" in str(err.value)


async def test_a_non_ascii_time_header_over_http_is_a_401():
    served = await _serve(_bank())
    try:
        body = m.pack(m.FeedsRequest(served.db.id, {}).encode())
        signed = sign_request(READER, "POST", "/sync/v1/feeds", body, str(NODE.public), protocol._now_ms())
        for text in ("²", "①"):
            head = "".join(f"{k}: {text if k == 'memmesh-time' else v}\r\n" for k, v in signed.headers.items())
            reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
            writer.write(b"POST /sync/v1/feeds HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + head.encode("utf-8")
                         + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            answer = await asyncio.wait_for(reader.read(), timeout=10)
            writer.close()
            assert answer.startswith(b"HTTP/1.1 401") and b"memmesh-time is not a time in ms" in answer, answer[:200]
    finally:
        await served.runner.cleanup()


async def test_a_body_cut_mid_stream_logs_one_line_without_a_traceback(caplog):
    served = await _serve(_bank())
    caplog.set_level(logging.DEBUG)
    try:
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
            writer.write(b"POST /sync/v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\n"
                         b"Content-Length: 100000\r\n\r\n" + b"\x00" * 5000)
            await writer.drain()
            writer.transport.abort()  # a reset mid-body
        for _ in range(200):
            if sum(r.getMessage() == "request" for r in caplog.records) >= 3:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        lines = [r for r in caplog.records if r.name.startswith(("memmesh", "node", "aiohttp"))]
        requests = [r for r in lines if r.getMessage() == "request"]
        assert len(requests) == 3 and len(lines) == 3, [(r.name, r.getMessage()) for r in lines]
        assert all(r.fields["status"] == 400 for r in requests)
        assert not any(r.exc_info for r in caplog.records)
    finally:
        await served.runner.cleanup()


async def test_a_busy_or_aborted_answer_is_a_clear_error_to_a_client(monkeypatch):
    """The client side reads 503 sync.busy as a typed error (the exchange retries next round)."""
    monkeypatch.setattr(sync_http, "BUSY_WAIT_S", 0.1)
    served = await _serve(_bank(), budget=BodyBudget(limit=10))
    try:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(SyncError) as err:
                await call(HttpTransport(session), Client(READER), served.address, str(NODE.public),
                           m.FeedsRequest(served.db.id, {}))
        assert err.value.reason == "sync.busy" and err.value.status == 503
    finally:
        await served.runner.cleanup()


# ------------------------------------------------------------------ a real serve process
@pytest.mark.slow
def test_a_serve_process_answers_bad_bodies_with_4xx_and_one_line_each(tmp_path):
    """Against `memmesh serve`: a stranger's worst-case body, a non-ASCII time and bodies cut
    mid-stream are 4xx, its log holds no 500 and no traceback, and status still answers."""
    import socket

    from memmesh.node import Node
    from tests.procs import processes, until

    home = tmp_path / "node"
    node, _ = Node.init(home)
    with node:
        node.run("embedder.set", {"provider": "none"})
    with processes() as procs:
        s = procs.serve(home, interval=60).start().wait_ready()
        db_id = s.run("memory.new", {"name": "notes"}).data["id"]
        s.run("memory.share", {"bank": "notes", "perm": "read", "recipient": str(READER.public)})
        node_key, port = s.node_key, s.port

        def send(raw: bytes, *, cut: bool = False) -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
                sock.sendall(raw)
                if cut:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    return b""
                out = b""
                while chunk := sock.recv(65536):
                    out += chunk
                return out

        def request(who, op: str, body: bytes, **override: str) -> bytes:
            signed = sign_request(who, "POST", protocol.PREFIX + op, body, node_key, protocol._now_ms())
            head = "".join(f"{k}: {override.get(k, v)}\r\n" for k, v in signed.headers.items())
            return (f"POST {protocol.PREFIX}{op} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode() + head.encode()
                    + b"Content-Length: %d\r\n\r\n" % len(body) + body)

        worst = _worst_bodies(id_to_raw(db_id))["arrays of empty maps"]
        assert send(request(STRANGER, "push", worst)).startswith(b"HTTP/1.1 404")
        assert send(request(READER, "push", worst)).startswith(b"HTTP/1.1 400")
        feeds = m.pack(m.FeedsRequest(db_id, {}).encode())
        for text in ("²", "①"):
            assert send(request(READER, "feeds", feeds, **{"memmesh-time": text})).startswith(b"HTTP/1.1 401")
        for _ in range(3):
            send(b"POST /sync/v1/push HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"\x00" * 5000, cut=True)
        until(lambda: s.log().count("status=400") >= 4, 20, lambda: f"the aborted bodies were not logged:\n{s.log()}")
        assert s.status()  # the control channel answers
        log = s.log()
        assert "status=500" not in log and "Traceback" not in log and "ConnectionResetError" not in log, log
