"""The aiohttp adapter on a real loopback socket: exchanges over HTTP, the body cap enforced
before a body is read, and a slow client that does not hold the server."""
from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web

from node.sync import messages as m
from node.sync.http import HttpTransport, call, run_exchange, sync_app_routes
from node.sync.protocol import Client, Exchange, SyncError, SyncServer
from tests.dbkit import grant, key, new_db, state, write
from tests.test_sync_protocol import Node, _fresh

ADMIN, ALICE, PEER_A, PEER_B = key(1), key(2), key(41), key(42)


async def _direct(fn):
    return fn()


@pytest.fixture
async def served():
    db = new_db(ADMIN)
    grant(db, ADMIN, ALICE, "write")
    grant(db, ADMIN, PEER_A, "read")
    for i in range(40):
        write(db, ALICE, {"key": f"k{i}", "value": "v" * 500})
    node = Node()
    node.dbs[db.id] = db
    app = web.Application(client_max_size=m.MAX_BODY_BYTES)
    sync_app_routes(app, SyncServer(PEER_B, node), _direct, read_timeout=2.0)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield db, f"http:127.0.0.1:{port}", port
    await runner.cleanup()


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
        return await asyncio.wait_for(reader.read(4096), timeout=10)
    finally:
        writer.close()


async def test_an_oversized_body_is_refused_before_it_is_read(served):
    _, _, port = served
    head = (b"POST /sync/v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\n"
            b"Content-Length: 200000000\r\n\r\n")
    started = time.monotonic()
    answer = await _raw(port, head)  # not one byte of the 200 MB is sent
    assert answer.startswith(b"HTTP/1.1 413") and time.monotonic() - started < 5


async def test_a_slow_client_does_not_hold_the_server(served):
    db, address, port = served
    head = (b"POST /sync/v1/feeds HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\n"
            b"Content-Length: 100\r\n\r\n")
    slow = asyncio.create_task(_raw(port, head, [b"x"] * 100, delay=1.0))  # one byte a second
    await asyncio.sleep(0.3)
    started = time.monotonic()
    async with aiohttp.ClientSession() as session:
        _node, reply = await call(HttpTransport(session), Client(PEER_A), address, str(PEER_B.public),
                                  m.FeedsRequest(db.id, {}))
    assert reply.lacking == len(db) and time.monotonic() - started < 2
    answer = await slow
    assert answer.startswith(b"HTTP/1.1 408")  # cut off after the read timeout, not after 100 s
