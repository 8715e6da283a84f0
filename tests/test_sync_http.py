"""The aiohttp adapter on a real loopback socket: exchanges over HTTP, the body cap enforced
before a body is read, and a slow client that does not hold the server."""
from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest
from aiohttp import web

from memmesh.node.sync import messages as m
from memmesh.node.sync.http import HttpTransport, call, run_exchange, sync_app_routes
from memmesh.node.sync.protocol import Client, Exchange, SyncError, SyncServer
from tests.dbkit import grant, key, new_db, state, write
from tests.test_sync_protocol import Node, _fresh

ADMIN, ALICE, PEER_A, PEER_B = key(1), key(2), key(41), key(42)
HANG_GUARD_S = 120.0  # only so that a hang fails; nothing here is timed


async def _direct(fn):
    return fn()


@contextlib.asynccontextmanager
async def _serving(read_timeout: float):
    db = new_db(ADMIN)
    grant(db, ADMIN, ALICE, "write")
    grant(db, ADMIN, PEER_A, "read")
    for i in range(40):
        write(db, ALICE, {"key": f"k{i}", "value": "v" * 500})
    node = Node()
    node.dbs[db.id] = db
    app = web.Application(client_max_size=m.MAX_BODY_BYTES)
    sync_app_routes(app, SyncServer(PEER_B, node), _direct, read_timeout=read_timeout)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield db, f"http:127.0.0.1:{port}", port
    finally:
        await runner.cleanup()


@pytest.fixture
async def served():
    async with _serving(read_timeout=2.0) as served:
        yield served


async def test_an_exchange_over_http(served):
    db, address, _ = served
    mine = _fresh(db.id)
    async with aiohttp.ClientSession() as session:
        ex = Exchange(mine, str(PEER_B.public), page_bytes=4000)
        await run_exchange(HttpTransport(session), Client(PEER_A), address, str(PEER_B.public), ex, _direct)
    assert state(mine) == state(db) and ex.stats.pages > 3


async def test_a_bootstrap_in_pages_of_megabytes(served):
    """Replies far larger than one socket read arrive whole (a 2 MiB page)."""
    db, address, _ = served
    for i in range(400):
        write(db, ALICE, {"key": f"big{i}", "value": "x" * 6000})
    mine = _fresh(db.id)
    async with aiohttp.ClientSession() as session:
        ex = Exchange(mine, str(PEER_B.public), page_bytes=2 * 1024 * 1024)
        await run_exchange(HttpTransport(session), Client(PEER_A), address, str(PEER_B.public), ex, _direct)
    assert state(mine) == state(db) and ex.stats.bytes_in > 2 * 1024 * 1024 and ex.stats.pages >= 2


async def test_a_wrong_key_at_an_address_is_detected(served):
    db, address, _ = served
    async with aiohttp.ClientSession() as session:
        with pytest.raises(SyncError) as err:
            await call(HttpTransport(session), Client(PEER_A), address, str(ALICE.public), m.FeedsRequest(db.id, {}))
    assert err.value.reason == "sync.wrong_target"


async def test_unreachable_is_a_clear_error():
    async with aiohttp.ClientSession() as session:
        with pytest.raises(SyncError) as err:
            await call(HttpTransport(session, timeout=2), Client(PEER_A), "http:127.0.0.1:1", str(PEER_B.public), m.Hello())
    assert err.value.reason == "sync.unreachable" and "127.0.0.1:1" in str(err.value)


async def _raw(port: int, head: bytes, body_chunks=(), delay: float = 0.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    await writer.drain()
    for chunk in body_chunks:
        await asyncio.sleep(delay)
        try:
            writer.write(chunk)
            await writer.drain()
        except ConnectionError:  # the server gave up on us: read what it said
            break
        if reader.at_eof() or reader._buffer:  # an answer arrived before the body was done
            break
    try:
        return await asyncio.wait_for(reader.read(4096), timeout=HANG_GUARD_S)
    finally:
        writer.close()


async def test_an_oversized_body_is_refused_before_it_is_read(served):
    _, _, port = served
    head = (b"POST /sync/v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\n"
            b"Content-Length: 200000000\r\n\r\n")
    answer = await _raw(port, head)  # not one byte of the 200 MB is sent
    # 413 from the Content-Length alone: had the server waited for the body, the read timeout
    # would have answered 408 instead.
    assert answer.startswith(b"HTTP/1.1 413"), answer


async def test_a_slow_client_does_not_hold_the_server():
    """A client stalls mid-body; another's whole exchange is answered while the stalled request
    is still being read (the order of events, not a clock: the read timeout here is only a hang
    guard); the stalled one is answered once it sends the rest."""
    async with _serving(read_timeout=HANG_GUARD_S) as (db, address, port):
        head = (b"POST /sync/v1/feeds HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\n"
                b"Content-Length: 100\r\n\r\n")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(head + b"x")  # 1 of 100 bytes, then nothing until the other exchange is done
            await writer.drain()
            async with aiohttp.ClientSession() as session:
                _node, reply = await call(HttpTransport(session), Client(PEER_A), address, str(PEER_B.public),
                                          m.FeedsRequest(db.id, {}))
            assert reply.lacking == len(db)
            # The stalled request is still open and unanswered: nothing came back on its connection.
            assert not reader.at_eof() and not reader._buffer
            writer.write(b"x" * 99)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(4096), timeout=HANG_GUARD_S)
        finally:
            writer.close()
    # Read to its end and answered for what it is (an unsigned request: 401), not cut off (408).
    assert answer.startswith(b"HTTP/1.1 401"), answer


async def test_a_slow_client_is_cut_off_after_the_read_timeout(served):
    _, _, port = served
    head = (b"POST /sync/v1/feeds HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\n"
            b"Content-Length: 100\r\n\r\n")
    answer = await _raw(port, head, [b"x"] * 100, delay=1.0)  # one byte a second: 100 s in all
    # 408 is the read timeout's answer (the whole body, all 100 bytes, would have got another)
    assert answer.startswith(b"HTTP/1.1 408"), answer
