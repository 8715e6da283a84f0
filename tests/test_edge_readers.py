"""A bank leaves a node only for keys that may read it, as the bank's settings stand at that
moment (issue 19, section 1).

In-process (fast): the one rule (node/sync/readers.py) as every path asks it: the sync
server's reads, peer exchange in both directions, the daemon's choice of peers each round
(configured peers included, with the reason in the link status and `memmesh status`), the
one-shot `memmesh sync`, and an exchange that learns mid-way that its peer lost Read.

Across real serve processes (slow): a reader that names an un-granted key to a node (signed
POST /sync/v1/peers) gets that key nothing, from that node or from another that syncs with it;
a config.yaml peer without a grant receives nothing and `memmesh status` says why; a revoked
reader receives no entry written after the revocation reached the node, neither pulled nor
pushed. The un-granted keys listen as an outsider's server would (built from the protocol,
not from memmesh's node): it answers every request and stores whatever is pushed, which a
memmesh node without the bank never would.
"""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from memmesh.auth.keys import SigningKey
from memmesh.auth.ops import RevokeOp
from memmesh.node import Node
from memmesh.node.settings import CONFIG_FILE
from memmesh.node.sync import messages as m
from memmesh.node.sync import readers
from memmesh.node.sync.envelope import RequestVerifier, sign_response
from memmesh.node.sync.http import HttpTransport, call
from memmesh.node.sync.oneshot import sync_now
from memmesh.node.sync.protocol import Client, Exchange, ExchangeStats, SyncError, SyncServer
from memmesh.node.sync.service import ServedNode, SyncService
from memmesh.node.sync.state import now_ms
from memmesh.node.worker import run_here
from tests.procs import processes, until

BANK = "project-notes"
REACH_S = 30.0  # generous: a loaded 2-core machine runs several serves at once
ROUNDS = 3  # full daemon rounds that must pass (each would have pushed, before the fix)


# ============================================================================ in-process
def _home(path: Path) -> Node:
    node = Node.open(path)
    node.run("embedder.set", {"provider": "none"})
    return node


@pytest.fixture
def a(tmp_path):
    """A node with a shared bank: alpha writes, reader and gone read (gone is then revoked)."""
    node = _home(tmp_path / "a")
    for name in ("alpha", "reader", "gone"):
        node.run("agent.new", {"name": name})
    node.run("memory.new", {"name": BANK})
    node.run("memory.grant", {"bank": BANK, "agent": "alpha", "perm": "write"})
    node.run("memory.grant", {"bank": BANK, "agent": "reader", "perm": "read"})
    node.run("memory.grant", {"bank": BANK, "agent": "gone", "perm": "read"})
    node.run("remember", {"agent": "alpha", "key": "secret", "value": "the launch code", "bank": BANK})
    node.sync.share(node.agents.resolve(BANK).db.id)
    yield node
    node.close()


def _key(node: Node, agent: str) -> str:
    return str(node.agents.agent(agent).key.public)


def _db(node: Node):
    return node.agents.resolve(BANK).db


def test_the_rule_follows_the_settings_now(a):
    db = _db(a)
    stranger = str(SigningKey.generate().public)
    assert readers.may_read(a, db, _key(a, "reader")) and readers.may_read(a, db, _key(a, "alpha"))
    assert readers.refusal(a, db, stranger) == f"{stranger} holds no grant on {BANK}"
    served = ServedNode(a)
    assert served.readable(db.id, _key(a, "gone")) is db
    a.run("memory.revoke", {"bank": BANK, "agent": "gone"})
    assert served.readable(db.id, _key(a, "gone")) is None  # asked again: nothing cached
    assert readers.refusal(a, db, _key(a, "gone")).endswith(f"holds no grant on {BANK} (its grant was revoked)")
    # An invite key this node issued only redeems, whatever the settings say of it.
    from memmesh.tickets import decode

    invite = decode(a.run("memory.share", {"bank": BANK, "perm": "read"}).data["ticket"]).invite
    assert not readers.may_read(a, db, invite) and served.readable(db.id, invite) is None


def test_peer_exchange_hands_out_and_learns_only_readers(a):
    db = _db(a)
    served = ServedNode(a)
    reader, gone, stranger = _key(a, "reader"), _key(a, "gone"), str(SigningKey.generate().public)
    named = [m.PeerInfo(k, ("http:127.0.0.1:9",)) for k in (stranger, gone, _key(a, "alpha"))]
    served.learn_peers(db.id, reader, named)
    assert {r.key for r in a.sync.peers.peers(db.id)} == {gone, _key(a, "alpha")}
    a.run("memory.revoke", {"bank": BANK, "agent": "gone"})
    # A peer learnt while it could read stays in the book, but is handed out no more ...
    a.sync.peers.add(db.id, stranger, ["http:127.0.0.1:9"], "manual", now_ms())
    assert [p.key for p in served.peers_of(db.id, reader)] == [_key(a, "alpha")]
    # ... nor chosen by the daemon; what it learns from a reply is filtered alike.
    service = SyncService(a, address="http:127.0.0.1:1", discovery=False)
    assert set(service.targets(db.id)) == {_key(a, "alpha")}
    assert [p.key for p in readers.readers(a, db, named)] == [_key(a, "alpha")]


def test_a_round_skips_peers_without_read_and_status_says_why(a):
    db = _db(a)
    stranger = str(SigningKey.generate().public)
    reader, gone = _key(a, "reader"), _key(a, "gone")
    for k in (reader, gone):
        a.sync.peers.add(db.id, k, ["http:127.0.0.1:9"], "manual", now_ms())
    a.sync.record_exchange(db.id, gone, "http:127.0.0.1:9", ExchangeStats())  # it synced while it could read
    service = SyncService(a, address="http:127.0.0.1:1", discovery=False, fanout=10)
    configured = [(stranger, "http:127.0.0.1:8"), (reader, "http:127.0.0.1:7")]
    assert service.targets(db.id, configured) == {reader: ["http:127.0.0.1:7", "http:127.0.0.1:9"], gone: ["http:127.0.0.1:9"]}
    a.run("memory.revoke", {"bank": BANK, "agent": "gone"})
    assert set(service.targets(db.id, configured)) == {reader}  # from the next round on
    links = {link.peer: link.last_error for link in a.sync.links(db.id)}
    assert f"{stranger} holds no grant on {BANK}" in links[stranger]
    assert f"{gone} holds no grant on {BANK} (its grant was revoked)" in links[gone]
    status = a.run("status", {})
    assert f"holds no grant on {BANK}" in status.text
    [bank] = [d for d in status.data["databases"] if d["bank"] == BANK]
    by_peer = {p["peer"]: p for p in bank["sync"]["peers"]}
    assert by_peer[stranger]["not_sent"] == f"{stranger} holds no grant on {BANK}"
    assert by_peer[stranger]["last_error"].startswith(readers.NO_GRANT) and by_peer[gone]["not_sent"]
    saved: list[Any] = []
    save = a.sync.save_link
    a.sync.save_link = lambda link: (saved.append(link.peer), save(link))  # type: ignore[method-assign]
    service.targets(db.id, configured)  # the same refusals again: nothing rewritten each round
    assert saved == []


async def test_the_one_shot_sync_contacts_no_peer_without_read(a):
    db = _db(a)
    stranger = str(SigningKey.generate().public)
    a.sync.peers.add(db.id, stranger, ["http:127.0.0.1:9"], "manual", now_ms())
    assert await sync_now(a, [db.id], None, run_here) == []  # the only known peer may not read it


def test_an_exchange_stops_pushing_once_its_peer_may_not_read():
    """The daemon asks before each push page: a revocation pulled meanwhile stops the push."""
    from memmesh.crdt.database import Database
    from memmesh.crdt.storage import MemoryStorage
    from tests.dbkit import grant, key, new_db, write

    admin, peer_a, peer_b = key(1), key(41), key(42)
    src = new_db(admin)
    grant(src, admin, peer_a, "read")
    grant(src, admin, peer_b, "read")
    ids = src.missing_for({})
    for i in range(5):
        write(src, admin, {"key": f"k{i}", "value": "v"})
    storage = MemoryStorage()
    storage.add_database(src.id)
    dst = Database(storage, src.id)
    dst.ingest(src.page(ids, 1 << 22)[0], source="test")  # the settings, none of the rows

    class Served:
        def readable(self, db_id, caller):
            return dst if db_id == dst.id else None

        def peers_of(self, db_id, caller):
            return []

        def learn_peers(self, db_id, caller, peers):
            pass

        def redeem(self, *args):
            return None

    server, client = SyncServer(peer_b, Served()), Client(peer_a)
    before = len(dst)

    def drive(exchange: Exchange) -> None:
        for _ in range(100):
            msg = exchange.next_message()
            if msg is None:
                return
            out = client.request(str(peer_b.public), msg)
            r = out.request
            resp = server.handle(r.method, r.path, r.headers, r.body)
            exchange.on_reply(client.reply(out, resp.status, resp.headers, resp.body)[1])
        raise AssertionError("the exchange did not end within 100 requests")

    with pytest.raises(SyncError) as stopped:
        drive(Exchange(src, str(peer_b.public), refusal=lambda: f"{peer_b.public} holds no grant on notes"))
    assert stopped.value.reason == readers.NO_GRANT and len(dst) == before
    drive(Exchange(src, str(peer_b.public), refusal=lambda: None))
    assert len(dst) == len(src)


# ============================================================================ across serve processes
class Outsider:
    """A key nobody granted, listening on 127.0.0.1 as an outsider's server would: it answers
    every sync request (signed with its key, as the protocol wants) and records what each
    caller sent, so a node that pushes a bank to it is seen doing so."""

    def __init__(self) -> None:
        self.key = SigningKey.generate()
        self.verifier = RequestVerifier(str(self.key.public))
        self.seen: list[tuple[str, str | None, str, int]] = []  # (op, db, caller, entries)
        self.port = 0

    @property
    def public(self) -> str:
        return str(self.key.public)

    @property
    def address(self) -> str:
        return f"http:127.0.0.1:{self.port}"

    def bank_requests(self, db_id: str) -> list[tuple[str, str | None, str, int]]:
        return [s for s in list(self.seen) if s[1] == db_id]

    async def handle(self, request: web.Request) -> web.Response:
        op = request.match_info["op"]
        body = await request.read()
        try:
            caller = self.verifier.verify("POST", request.path, dict(request.headers), body, now_ms(),
                                          allow_any_target=(op == "hello"))
            message = m.decode_request(op, body)
        except Exception:  # an outsider answers what it cannot read with a bare 400
            return web.Response(status=400)
        db = getattr(message, "db", None)
        entries = len(getattr(message, "entries", ()) or ())
        self.seen.append((op, db, caller.key, entries))
        reply: Any = {"hello": m.Hello(), "feeds": m.FeedsReply({}, {}, 0), "pull": m.PullReply([], None, False),
                      "push": m.PushReply(entries, 0, 0, {}), "peers": m.PeersReply([])}.get(op)
        if reply is None:
            return web.Response(status=404)
        payload = m.pack(reply.encode())
        return web.Response(status=200, body=payload, headers={**sign_response(self.key, 200, payload, caller),
                                                               "content-type": "application/msgpack"})


class Outsiders:
    """Outsider servers on one event loop in a thread, for a test's duration."""

    def __init__(self, n: int) -> None:
        self.all = [Outsider() for _ in range(n)]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="outsiders", daemon=True)
        self._runners: list[web.AppRunner] = []

    def __enter__(self) -> list[Outsider]:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self.all

    async def _start(self) -> None:
        for o in self.all:
            app = web.Application(client_max_size=m.MAX_BODY_BYTES)
            app.router.add_post("/sync/v1/{op}", o.handle)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            o.port = site._server.sockets[0].getsockname()[1]
            self._runners.append(runner)

    def __exit__(self, *exc: Any) -> None:
        async def stop() -> None:
            for r in self._runners:
                await r.cleanup()

        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


def _init(home: Path) -> str:
    node, _ = Node.init(home)
    with node:
        node.run("embedder.set", {"provider": "none"})
        return str(node.peer_key.public)


def _bank(serve, name: str = BANK) -> dict[str, Any]:
    [d] = [d for d in serve.run("status", {}).data["databases"] if d["bank"] == name]
    return d


def _rounds(serve) -> int:
    return int(serve.status()["sync"]["rounds"])


def _after_rounds(serve, n: int = ROUNDS) -> None:
    """Wait until ``serve``'s daemon has run ``n`` more rounds (each syncs every shared bank)."""
    start = _rounds(serve)
    until(lambda: _rounds(serve) >= start + n, REACH_S, f"{n} more sync rounds of {serve.home.name}")


def _link(serve, db_id: str, peer: str) -> dict[str, Any] | None:
    return next((x for x in serve.run("status", {}).data["sync"]["links"] if x["db"] == db_id and x["peer"] == peer),
                None)


def _a_with_bank(home: Path, key: str, value: str) -> None:
    """Node A: the bank, alpha granted Write on it, and one memory of alpha's in it."""
    _init(home)
    with Node.open(home) as node:
        node.run("agent.new", {"name": "alpha"})
        node.run("memory.new", {"name": BANK})
        node.run("memory.grant", {"bank": BANK, "agent": "alpha", "perm": "write"})
        node.run("remember", {"agent": "alpha", "key": key, "value": value, "bank": BANK})


def _a_shares_with_b(procs, a_home: Path, b_home: Path, b_key: str) -> tuple[Any, Any, str]:
    """Serve A and B; A shares the bank with B's key (Read), B imports it: (A, B, the bank's id)."""
    sa = procs.serve(a_home, interval=0.5).start()
    sb = procs.serve(b_home, interval=0.5).start()
    sa.wait_ready(), sb.wait_ready()
    share = sa.run("memory.share", {"bank": BANK, "perm": "read", "recipient": b_key}).data
    sb.run("memory.import", {"ticket": share["ticket"], "perm": "read"})
    return sa, sb, share["db"]


def _memory_values(home: Path) -> list[str]:
    with Node.open(home) as node:
        return [r.value.get("value") for r in node.agents.resolve(BANK).db.rows("memory")]


@pytest.mark.slow
def test_a_reader_naming_an_ungranted_key_and_a_config_peer_without_grant_get_nothing(tmp_path):
    a_home, b_home = tmp_path / "a", tmp_path / "b"
    b_key = _init(b_home)
    _a_with_bank(a_home, "secret", "the launch code")
    with Node.open(a_home) as node:
        node.run("agent.new", {"name": "reader"})
        node.run("memory.grant", {"bank": BANK, "agent": "reader", "perm": "read"})
        reader = node.load_key("agent-reader")
    with Outsiders(2) as (named, configured), processes() as procs:
        (a_home / CONFIG_FILE).write_text(f"sync:\n  peers: [{configured.address}]\n")
        sa, sb, db_id = _a_shares_with_b(procs, a_home, b_home, b_key)

        async def name_it() -> list[m.PeerInfo]:
            async with aiohttp.ClientSession() as session:
                _node, reply = await call(HttpTransport(session, timeout=10), Client(reader), sa.address,
                                          sa.node_key, m.PeersRequest(db_id, [m.PeerInfo(named.public, (named.address,))]))
            return reply.peers

        handed = asyncio.run(name_it())  # a Read holder may ask: 200, but the key is not learnt
        assert named.public not in {p.key for p in handed}
        t_named = now_ms()
        # B exchanges with A after that (peer exchange included), and both daemons go round.
        until(lambda: ((_link(sb, db_id, sa.node_key) or {}).get("last_success_ms") or 0) > t_named, REACH_S,
              "B to sync with A after the reader named the key")
        _after_rounds(sa)
        _after_rounds(sb)
        assert any(s[0] == "hello" for s in configured.seen)  # A did ask the configured address
        assert named.bank_requests(db_id) == [] and configured.bank_requests(db_id) == []
        until(lambda: f"holds no grant on {BANK}" in sa.run("status", {}).text, REACH_S,
              "A's status to say why the configured peer gets nothing")
        for s in (sa, sb):
            known = {p["key"] for p in s.run("peers", {}).data["peers"]}
            assert named.public not in known and configured.public not in known
        link = _link(sa, db_id, configured.public)
        assert link is not None and f"{configured.public} holds no grant on {BANK}" in link["last_error"]
        [peer] = [p for p in _bank(sa)["sync"]["peers"] if p["peer"] == configured.public]
        assert peer["not_sent"] == f"{configured.public} holds no grant on {BANK}"
        assert named.bank_requests(db_id) == [] and configured.bank_requests(db_id) == []


@pytest.mark.slow
def test_a_revoked_reader_gets_nothing_written_after_the_revocation(tmp_path):
    a_home, b_home = tmp_path / "a", tmp_path / "b"
    b_key = _init(b_home)
    _a_with_bank(a_home, "before", "written before")
    with processes() as procs:
        sa, sb, db_id = _a_shares_with_b(procs, a_home, b_home, b_key)
        until(lambda: _link(sa, db_id, b_key) is not None and _link(sa, db_id, b_key)["last_success_ms"], REACH_S,
              "A to sync with B")
        # The revocation reaches A (its admin writes it while serve is down), and a memory after it.
        port = sa.port
        assert sa.stop() == 0
        with Node.open(a_home) as node:
            bank = node.agents.resolve(BANK)
            bank.db.change_settings(node.peer_key, [RevokeOp(b_key)])
            node.run("remember", {"agent": "alpha", "key": "after", "value": "written after offline", "bank": BANK})
        sa.listen = f"127.0.0.1:{port}"  # B knows A at this address only
        sa.start().wait_ready()
        t_back = now_ms()
        sa.run("remember", {"agent": "alpha", "key": "later", "value": "written after live", "bank": BANK})
        # Both daemons go round: A chooses its peers, B tries to pull from A (refused).
        _after_rounds(sa)
        until(lambda: ((_link(sb, db_id, sa.node_key) or {}).get("last_error") or "").startswith("sync.not_found")
              and ((_link(sb, db_id, sa.node_key) or {}).get("last_success_ms") or 0) < t_back, REACH_S,
              "B's pull from A to be refused")
        _after_rounds(sb)
        _after_rounds(sa)
        assert sb.stop() == 0
        values = _memory_values(b_home)
        assert "written before" in values
        assert "written after offline" not in values and "written after live" not in values, values
        link = _link(sa, db_id, b_key) or {}
        assert f"holds no grant on {BANK} (its grant was revoked)" in (link.get("last_error") or ""), link
