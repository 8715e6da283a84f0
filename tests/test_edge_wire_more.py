"""The sync wire, tried again as an outsider would with new cases (issue 19, sections 1, 3, 4).

In-process: an exchange asks before EVERY request whether its peer may still read the bank
(a revocation pulled mid-way stops the pulls and the peer exchange too, not only the pushes);
a repair pulls "blind" from a peer its own copy of the settings does not grant (no feeds,
evidence, wanted ids or peers of ours go out, nothing is pushed); a peer that answers "more"
forever, with pages that put nothing in the log, or past the exchange's deadline, cannot hold
an exchange (and so a daemon round) forever; a body whose ``db`` cannot be read first is
refused before anything is decoded; a field given twice, a nonce with whitespace and
duplicate ``memmesh-*`` headers are refused; a flood of signed requests under fresh keys does
not lock other callers out of the replay cache.

Across a real serve process (slow): a hostile reader answering pulls forever does not stop the
daemon's rounds.
"""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
from aiohttp import web

from memmesh.auth.keys import SigningKey
from memmesh.crdt.database import Database
from memmesh.crdt.storage import MemoryStorage
from memmesh.node import Node
from memmesh.node.settings import CONFIG_FILE
from memmesh.node.sync import messages as m
from memmesh.node.sync.envelope import EnvelopeError, RequestVerifier, sign_request, sign_response
from memmesh.node.sync.http import HttpTransport, run_exchange, sync_app_routes
from memmesh.node.sync.protocol import PREFIX, Client, Exchange, SyncError, SyncServer
from memmesh.node.sync.state import now_ms
from memmesh.node.worker import run_here
from tests.dbkit import grant, key, new_db, write
from tests.procs import processes, until
from tests.served import Served

REACH_S = 30.0


# ============================================================================ helpers


def _source(n: int = 5) -> tuple[Database, SigningKey, SigningKey]:
    """A bank with an admin, a reader key (the peer) and ``n`` memories."""
    admin, peer = key(1), key(41)
    src = new_db(admin)
    grant(src, admin, peer, "read")
    for i in range(n):
        write(src, admin, {"key": f"k{i}", "value": "v" * 64})
    return src, admin, peer


def _empty_replica(db_id: str) -> Database:
    storage = MemoryStorage()
    storage.add_database(db_id)
    return Database(storage, db_id)


class Recorder:
    """Drives an Exchange against a SyncServer in place, recording every request it sends."""

    def __init__(self, client_key: SigningKey, server_key: SigningKey, served: Database) -> None:
        self.client = Client(client_key)
        self.server = SyncServer(server_key, Served(served))
        self.target = str(server_key.public)
        self.sent: list[Any] = []

    def drive(self, exchange: Exchange, after_reply: Any = None) -> None:
        for _ in range(200):
            msg = exchange.next_message()
            if msg is None:
                return
            self.sent.append(msg)
            out = self.client.request(self.target, msg)
            r = out.request
            resp = self.server.handle(r.method, r.path, r.headers, r.body)
            exchange.on_reply(self.client.reply(out, resp.status, resp.headers, resp.body)[1])
            if after_reply is not None:
                after_reply(msg)
        raise AssertionError("the exchange did not end within 200 requests")


# ============================================================================ section 1: only readers
def test_a_peer_that_loses_read_mid_exchange_is_sent_nothing_more():
    """Before: only push pages asked; the pulls went on and the peer exchange named our other
    readers (keys and addresses) to a key that had just lost Read."""
    src, admin, peer = _source()
    # The node that syncs holds the settings only: it pulls the rows, and has nothing to push.
    ours = _empty_replica(src.id)
    ours.ingest(src.page(src.missing_for({}), 1 << 22)[0][:2], source="test")
    rec = Recorder(admin, peer, src)
    state = {"why": None}
    other = m.PeerInfo(str(key(43).public), ("http:127.0.0.1:9",))
    exchange = Exchange(ours, str(peer.public), known_peers=[other], refusal=lambda: state["why"])

    def revoked_by_the_first_reply(_msg: Any) -> None:
        state["why"] = f"{peer.public} holds no grant on notes (its grant was revoked)"

    with pytest.raises(SyncError) as stopped:
        rec.drive(exchange, revoked_by_the_first_reply)
    assert stopped.value.reason == "sync.no_grant"
    assert [x.op for x in rec.sent] == ["feeds"], [x.op for x in rec.sent]


def test_a_repair_pulls_blind_from_a_peer_its_copy_does_not_grant():
    """`memmesh check --repair` asks every peer of the book: one this copy does not grant is
    told nothing of ours (no feeds, evidence, wanted ids, peers) and pushed nothing."""
    src, admin, peer = _source()
    ours = _empty_replica(src.id)
    ids = src.missing_for({})
    ours.ingest(src.page(ids, 1 << 22)[0][:1], source="test")  # the root only: no grant of peer yet
    rec = Recorder(admin, peer, src)
    exchange = Exchange(ours, str(peer.public), known_peers=[m.PeerInfo(str(admin.public), ("http:127.0.0.1:9",))],
                        refusal=lambda: "holds no grant on notes", blind=True, page_bytes=1024)
    rec.drive(exchange)
    ops = [x.op for x in rec.sent]
    assert ops[0] == "feeds" and set(ops) == {"feeds", "pull"}, ops  # no push, no peers
    for x in rec.sent:
        assert x.feeds == {} and x.evidence == {}
        assert getattr(x, "want", ()) == ()
    assert len(ours) == len(src)  # what the peer holds is pulled all the same
    assert exchange.stats.withheld == "holds no grant on notes"


# ============================================================================ section 4: work
def test_an_exchange_asks_no_page_after_its_deadline():
    src, admin, peer = _source(20)
    ours = _empty_replica(src.id)
    rec = Recorder(admin, peer, src)
    exchange = Exchange(ours, str(peer.public), known_peers=[], refusal=lambda: None, deadline_s=0.0,
                        page_bytes=512)
    rec.drive(exchange)
    assert [x.op for x in rec.sent] == ["feeds", "peers"] and exchange.stats.cut


class Endless:
    """A reader's server that answers every pull with the same page, a cursor that moves and
    "more": a well-formed, signed, endless answer."""

    def __init__(self, key_: SigningKey, page: list[m.EntryWire], first_id: str) -> None:
        self.key = key_
        self.verifier = RequestVerifier(str(key_.public))
        self.page, self.first_id = page, first_id
        self.ops: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        op = request.match_info["op"]
        body = await request.read()
        caller = self.verifier.verify("POST", request.path, dict(request.headers), body, now_ms(),
                                      allow_any_target=(op == "hello"))
        message = m.decode_request(op, body)
        self.ops.append(op)
        reply: Any = {"hello": m.Hello(), "feeds": m.FeedsReply({}, {}, 5),
                      "pull": m.PullReply(self.page, (len(self.ops), self.first_id), True),
                      "push": m.PushReply(len(getattr(message, "entries", ())), 0, 0, {}),
                      "peers": m.PeersReply([])}[op]
        payload = m.pack(reply.encode())
        return web.Response(status=200, body=payload, headers={**sign_response(self.key, 200, payload, caller),
                                                               "content-type": "application/msgpack"})

    async def start(self) -> tuple[web.AppRunner, str]:
        app = web.Application(client_max_size=m.MAX_BODY_BYTES)
        app.router.add_post(PREFIX + "{op}", self.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, f"http:127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


async def test_a_peer_answering_more_forever_does_not_hold_the_exchange():
    """Before: the pull went on as long as the peer said "more" with a new cursor (8,000 pulls
    in 8 s, never ending), and the daemon's round, which waits for its exchanges, with it."""
    src, admin, peer = _source(3)
    ids = src.missing_for({})
    endless = Endless(peer, src.page(ids, 1 << 22)[0], ids[0])  # entries we hold already
    runner, address = await endless.start()
    try:
        async with aiohttp.ClientSession() as session:
            exchange = Exchange(src, str(peer.public), known_peers=[], refusal=lambda: None)
            await asyncio.wait_for(run_exchange(HttpTransport(session), Client(admin), address, str(peer.public),
                                                exchange, run_here), REACH_S)
    finally:
        await runner.cleanup()
    assert 1 <= endless.ops.count("pull") <= 2, endless.ops.count("pull")  # it pulled, then stopped


# ============================================================================ section 4: decoding
def _push_body(db_raw: Any, entries: int, db_last: bool = True) -> bytes:
    fields = [("entries", [[b"h" * 10, {}] for _ in range(entries)]), ("db", db_raw)]
    if not db_last:
        fields.reverse()
    out = bytes([0x80 | len(fields)])
    for name, value in fields:
        out += msgpack.packb(name) + msgpack.packb(value, use_bin_type=True)
    return out


@pytest.mark.parametrize("db_raw", [b"\x01" * 31, b"\x01" * 4096, "not bytes", 7], ids=["31 bytes", "4 KiB", "a string", "an int"])
def test_a_body_without_a_readable_db_is_refused_before_decoding(monkeypatch, db_raw):
    src, admin, peer = _source(1)
    server = SyncServer(peer, Served(src))
    decoded: list[str] = []
    real = m.decode_request
    monkeypatch.setattr(m, "decode_request", lambda op, body: (decoded.append(op), real(op, body))[1])
    stranger = SigningKey.generate()
    body = _push_body(db_raw, 5000)
    r = sign_request(stranger, "POST", PREFIX + "push", body, str(peer.public), now_ms())
    resp = server.handle(r.method, r.path, r.headers, r.body)
    assert resp.status == 400 and m.unpack(resp.body)["error"] == "sync.bad_message"
    assert decoded == []  # nothing of the 5,000 entries was built


def test_a_field_given_twice_is_refused_by_name():
    """Duplicate keys were refused before too (as a missing field); now the answer names them."""
    src, admin, peer = _source(1)
    server = SyncServer(peer, Served(src))
    body = m.pack(m.PeersRequest(src.id, []).encode())  # {"db": ..., "peers": []}
    db_field = body[1:1 + 3 + 2 + 32]  # "db" (fixstr 2) and its bin8 of 32 bytes
    assert db_field[:3] == b"\xa2db"
    twice = bytes([0x82]) + db_field + db_field
    r = sign_request(admin, "POST", PREFIX + "peers", twice, str(peer.public), now_ms())
    resp = server.handle(r.method, r.path, r.headers, r.body)
    assert resp.status == 400 and "given twice" in m.unpack(resp.body)["message"], (resp.status, resp.body)


# ============================================================================ section 4: headers
def test_a_nonce_with_whitespace_is_refused():
    peer, caller = key(41), key(42)
    verifier = RequestVerifier(str(peer.public))
    short = bytes(range(11))
    r = sign_request(caller, "POST", PREFIX + "feeds", b"\x80", str(peer.public), now_ms(), nonce=short)
    spaced = " ".join(f"{b:02x}" for b in short)  # 32 characters, 11 bytes for bytes.fromhex
    assert len(spaced) == 32
    with pytest.raises(EnvelopeError, match="16 bytes"):
        verifier.verify("POST", r.path, {**r.headers, "memmesh-nonce": spaced}, r.body, now_ms())


def test_a_flood_of_signed_requests_does_not_lock_other_callers_out():
    """Before: once the replay cache held max_nonces entries, every caller got sync.busy for
    the rest of the window, and anyone can sign requests under fresh keys."""
    node = key(41)
    verifier = RequestVerifier(str(node.public), max_nonces=50)
    t0 = now_ms()
    first = None
    for i in range(120):
        r = sign_request(SigningKey.generate(), "POST", PREFIX + "hello", b"\x81\xa1v\x01", "*", t0 - 1000 + i)
        verifier.verify(r.method, r.path, r.headers, r.body, t0, allow_any_target=True)
        first = first or r
    honest = sign_request(key(42), "POST", PREFIX + "hello", b"\x81\xa1v\x01", "*", t0)
    assert verifier.verify(honest.method, honest.path, honest.headers, honest.body, t0, allow_any_target=True)
    # A forgotten nonce is not a way in: its time is at or below the floor.
    with pytest.raises(EnvelopeError) as refused:
        verifier.verify(first.method, first.path, first.headers, first.body, t0, allow_any_target=True)
    assert refused.value.reason == "sync.busy"
    with pytest.raises(EnvelopeError) as again:  # one still held is a replay, as before
        verifier.verify(honest.method, honest.path, honest.headers, honest.body, t0, allow_any_target=True)
    assert again.value.reason == "sync.replay"


async def test_memmesh_headers_given_twice_are_refused():
    src, admin, peer = _source(1)
    server = SyncServer(peer, Served(src))
    app = web.Application(client_max_size=m.MAX_BODY_BYTES)
    sync_app_routes(app, server, run_here)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        body = m.pack(m.FeedsRequest(src.id, {}, {}).encode())
        r = sign_request(admin, "POST", PREFIX + "feeds", body, str(peer.public), now_ms())
        other = sign_request(admin, "POST", PREFIX + "feeds", body, str(peer.public), now_ms())
        lines = [f"POST {r.path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/msgpack",
                 f"Content-Length: {len(body)}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in other.headers.items() if k == "memmesh-nonce"]  # a decoy first
        lines += [f"{k}: {v}" for k, v in r.headers.items()]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), REACH_S)
        writer.close()
        head, _, payload = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 401"), head
        assert "memmesh-nonce given more than once" in m.unpack(payload)["message"]
    finally:
        await runner.cleanup()


# ============================================================================ across a serve process
class EndlessThread:
    """An Endless server on its own loop in a thread (a serve process syncs with it)."""

    def __init__(self, endless: Endless) -> None:
        self.endless = endless
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="endless", daemon=True)
        self.address = ""
        self.runner: web.AppRunner | None = None

    def __enter__(self) -> EndlessThread:
        self.thread.start()
        self.runner, self.address = asyncio.run_coroutine_threadsafe(self.endless.start(), self.loop).result(30)
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.runner is not None:
                asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


@pytest.mark.slow
def test_a_reader_answering_pulls_forever_does_not_stop_the_daemon(tmp_path: Path):
    home = tmp_path / "a"
    node, _ = Node.init(home)
    hostile = SigningKey.generate()
    with node:
        node.run("embedder.set", {"provider": "none"})
        node.run("agent.new", {"name": "alpha"})
        node.run("memory.new", {"name": "notes"})
        node.run("memory.grant", {"bank": "notes", "agent": "alpha", "perm": "write"})
        node.run("remember", {"agent": "alpha", "key": "k", "value": "v", "bank": "notes"})
        db = node.agents.resolve("notes").db
        node.run("memory.grant", {"bank": "notes", "agent": str(hostile.public), "perm": "read"})
        node.sync.share(db.id)
        ids = db.missing_for({})
        page = db.page(ids, 1 << 22)[0]  # what the node holds already: duplicates to it
    with EndlessThread(Endless(hostile, page, ids[0])) as srv, processes() as procs:
        (home / CONFIG_FILE).write_text(f"sync:\n  peers: [{srv.address}]\n")
        serve = procs.serve(home, interval=0.5).start().wait_ready()
        until(lambda: srv.endless.ops.count("pull") > 0, REACH_S, "the daemon to pull from the hostile reader")
        start = int(serve.status()["sync"]["rounds"])
        until(lambda: int(serve.status()["sync"]["rounds"]) >= start + 3, REACH_S,
              lambda: f"3 more daemon rounds (pulls so far: {srv.endless.ops.count('pull')})")
