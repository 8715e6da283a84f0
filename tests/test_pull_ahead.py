"""Pulling the next page while this one is taken in (``Exchange(pull_ahead=True)``).

An import asks page k+1 as soon as page k arrives, so that the issuer builds and sends it while
the importer ingests page k. The request is the one ``next_message`` would have made (it
carries the feeds of before page k, and the peer pages from the cursor): the same pages, no
more requests, at most one page ahead; and it is dropped when the exchange does not go on as
it expected (a page that stored nothing, a refusal, the deadline).
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from memmesh.crdt.database import Database
from memmesh.crdt.storage import MemoryStorage
from memmesh.node.sync import messages as m
from memmesh.node.sync.http import HttpTransport, run_exchange, sync_app_routes
from memmesh.node.sync.protocol import FIRST_PULL_BYTES, Client, Exchange, SyncServer, after_cursor
from tests.dbkit import grant, key, new_db, state, write
from tests.served import Served

ADMIN, ALICE, PEER_A, PEER_B = key(1), key(2), key(41), key(42)
TARGET = str(PEER_B.public)


def _bank(n: int = 40) -> Database:
    db = new_db(ADMIN)
    grant(db, ADMIN, ALICE, "write")
    grant(db, ADMIN, PEER_A, "read")
    for i in range(n):
        write(db, ALICE, {"key": f"k{i}", "value": "v" * 300})
    return db


def _empty(db_id: str) -> Database:
    storage = MemoryStorage()
    storage.add_database(db_id)
    return Database(storage, db_id)


class Driver:
    """Drives an Exchange in place as run_exchange does: the request asked ahead is answered at
    once (the peer is quicker than our ingest), before the page it follows is taken in."""

    def __init__(self, served: Database) -> None:
        self.client = Client(PEER_A)
        self.server = SyncServer(PEER_B, Served(served))
        self.sent: list[Any] = []
        self.ahead_asked = 0
        self.ahead_used = 0

    def send(self, msg: Any) -> Any:
        self.sent.append(msg)
        out = self.client.request(TARGET, msg)
        r = out.request
        resp = self.server.handle(r.method, r.path, r.headers, r.body)
        return self.client.reply(out, resp.status, resp.headers, resp.body)[1]

    def drive(self, exchange: Exchange, before_taking: Any = None) -> None:
        ahead: tuple[Any, Any] | None = None
        for _ in range(500):
            msg = exchange.next_message()
            if msg is None:
                return
            if ahead is not None and msg is ahead[0]:
                reply = ahead[1]
                self.ahead_used += 1
            else:
                reply = self.send(msg)
            following = exchange.pull_ahead(reply)
            ahead = None
            if following is not None:
                self.ahead_asked += 1
                ahead = following, self.send(following)
            if before_taking is not None:
                before_taking(reply)
            exchange.on_reply(reply)
            while exchange.work():
                pass
        raise AssertionError("the exchange did not end within 500 requests")


def test_pages_asked_ahead_are_the_pages_asked_in_turn() -> None:
    bank = _bank()
    plain, ahead = Driver(bank), Driver(bank)
    mine_plain, mine_ahead = _empty(bank.id), _empty(bank.id)
    ex_plain = Exchange(mine_plain, TARGET, page_bytes=2000, push=False)
    ex_ahead = Exchange(mine_ahead, TARGET, page_bytes=2000, push=False, pull_ahead=True)
    plain.drive(ex_plain)
    ahead.drive(ex_ahead)
    assert state(mine_ahead) == state(mine_plain) == state(bank)
    pulls = [x for x in ahead.sent if x.op == "pull"]
    assert len(pulls) == len([x for x in plain.sent if x.op == "pull"]) > 5
    # Every page after the first was asked ahead and used; none was sent twice.
    assert ahead.ahead_asked == ahead.ahead_used == len(pulls) - 1 and plain.ahead_asked == 0
    assert ex_ahead.stats.pulled == len(bank) and ex_ahead.stats.pages == ex_plain.stats.pages
    assert [p.after for p in pulls] == [p.after for p in plain.sent if p.op == "pull"]
    # Each carries our feeds of before the page it follows was taken in.
    assert pulls[1].feeds == {} and len(pulls[-1].feeds) > 0


def test_the_first_page_is_small_and_each_next_one_four_times_larger() -> None:
    bank = _bank(900)  # about 450 KB of entries: more than the first page holds
    driver = Driver(bank)
    mine = _empty(bank.id)
    exchange = Exchange(mine, TARGET, push=False, pull_ahead=True)
    driver.drive(exchange)
    assert state(mine) == state(bank)
    sizes = [x.max_bytes for x in driver.sent if x.op == "pull"]
    assert sizes[0] == FIRST_PULL_BYTES < m.DEFAULT_PAGE_BYTES
    assert sizes[1:] == [min(FIRST_PULL_BYTES * 4 ** i, m.DEFAULT_PAGE_BYTES) for i in range(1, len(sizes))]
    assert len(sizes) >= 2  # the first page did not hold the bank


def test_a_page_that_stores_nothing_drops_the_request_asked_after_it() -> None:
    """The first page arrives also from elsewhere before it is taken in: it stores nothing, so
    the pull ends (as without asking ahead) and the page asked after it is not used."""
    bank = _bank()
    driver = Driver(bank)
    mine = _empty(bank.id)
    exchange = Exchange(mine, TARGET, page_bytes=2000, push=False, pull_ahead=True)
    pages = []

    def from_elsewhere(reply: Any) -> None:
        if isinstance(reply, m.PullReply) and not pages:
            pages.append(reply)
            mine.ingest(reply.entries)

    driver.drive(exchange, from_elsewhere)
    assert driver.ahead_asked == 1 and driver.ahead_used == 0
    assert [x.op for x in driver.sent].count("pull") == 2  # the first page, and the one asked ahead
    assert 0 < len(mine) < len(bank)  # the next exchange pulls the rest


def test_nothing_is_asked_ahead_unless_asked_for_nor_past_the_deadline_nor_of_a_refused_peer() -> None:
    bank = _bank(20)
    driver = Driver(bank)

    def first_page(exchange: Exchange) -> Any:
        reply = driver.send(exchange.next_message())
        exchange.on_reply(reply)
        page = driver.send(exchange.next_message())
        assert isinstance(page, m.PullReply) and page.more
        return page

    plain = Exchange(_empty(bank.id), TARGET, page_bytes=2000)
    assert plain.pull_ahead(first_page(plain)) is None

    late = Exchange(_empty(bank.id), TARGET, page_bytes=2000, pull_ahead=True, deadline_s=0.3)
    page = first_page(late)
    time.sleep(0.35)
    assert late.pull_ahead(page) is None

    why: dict[str, str | None] = {"now": None}
    refused = Exchange(_empty(bank.id), TARGET, page_bytes=2000, pull_ahead=True, refusal=lambda: why["now"])
    page = first_page(refused)
    why["now"] = "its grant was revoked"
    assert refused.pull_ahead(page) is None

    # A blind exchange (a repair) asks ahead too, telling the peer nothing of ours.
    blind = Exchange(_empty(bank.id), TARGET, page_bytes=2000, pull_ahead=True, blind=True,
                     refusal=lambda: "holds no grant")
    request = blind.pull_ahead(first_page(blind))
    assert request is not None and request.feeds == {} and request.evidence == {} and request.want == ()


class Recording(SyncServer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ops: list[str] = []

    def steps(self, method: str, path: str, headers: dict[str, str], body: Any, now_ms: int | None = None) -> Any:
        self.ops.append(path.rsplit("/", 1)[-1])
        return super().steps(method, path, headers, body, now_ms)


async def _direct(fn: Any) -> Any:
    return fn()


async def test_an_import_over_http_pulls_ahead_on_its_own_thread() -> None:
    bank = _bank(60)
    server = Recording(PEER_B, Served(bank))
    app = web.Application(client_max_size=m.MAX_BODY_BYTES)
    sync_app_routes(app, server, _direct)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    address = f"http:127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    pool = ThreadPoolExecutor(1)  # the database thread of the importing node

    async def on_db_thread(fn: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool, fn)

    try:
        mine = _empty(bank.id)
        async with aiohttp.ClientSession() as session:
            exchange = Exchange(mine, TARGET, page_bytes=3000, push=False, pull_ahead=True)
            await asyncio.wait_for(run_exchange(HttpTransport(session), Client(PEER_A), address, TARGET, exchange,
                                                on_db_thread), 60)
    finally:
        await runner.cleanup()
        pool.shutdown()
    assert state(mine) == state(bank)
    assert server.ops.count("pull") == exchange.stats.pages > 5  # each page asked once


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_entries_after_a_cursor_are_those_the_plain_filter_keeps(data: st.DataObject) -> None:
    bank = _CURSOR_BANK
    ids = bank.missing_for({})
    cut = data.draw(st.integers(0, len(ids)))
    after = (bank.height_of(ids[cut - 1]) or 0, ids[cut - 1]) if cut else (0, "")
    if data.draw(st.booleans()) and cut:  # a cursor between ids, not one of them
        after = (after[0], after[1] + "~")
    want = data.draw(st.lists(st.sampled_from(ids), max_size=6))
    wanted = set(want)
    plain = [i for i in ids if i in wanted or (bank.height_of(i), i) > after]
    assert after_cursor(bank, ids, after, want) == plain


_CURSOR_BANK = _bank(60)
