"""The live event stream, /metrics and /v1/health (node/events.py, node/api/live.py).

1. The bus alone: strictly increasing ids, a ring that overflows into a ``missed`` range, the
   types filter, many threads publishing at once, wake-ups across threads.
2. The real API app on 127.0.0.1 over a real node (SQLite home in tmp_path) on a real database
   thread, with the database watch serve starts: every route with and without the token, SSE
   frames as the contract says, resuming with ``since`` without loss or duplicates, bad
   ``since``/``types`` refused with a 400 that changes nothing, metrics that parse and agree
   with the status command.
3. (slow) A real `memmesh serve` process: an entry forged by a key the bank does not grant,
   pushed by a peer that may read it, is on the event stream as ``entry.refused`` with its
   reason and that peer's key within a second; /metrics counts it; /v1/health needs no token.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from memmesh.auth.keys import SigningKey
from memmesh.crdt.entry import client_id_for, sign_entry
from memmesh.crdt.yjs import encode_rows
from memmesh.node import Node
from memmesh.node.api.app import build_app
from memmesh.node.api.live import Live
from memmesh.node.api_token import read_token
from memmesh.node.control_server import CommandRunner
from memmesh.node.events import EVENT_TYPES, DatabaseWatch, EventBus, UnknownEventType
from memmesh.node.worker import DbThread, Network, OnServeLoop

HANG_GUARD_S = 60.0  # only so that a hang fails: nothing in this file is timed


# ============================================================================ 1. the bus
def test_ids_strictly_increase_and_a_read_resumes_after_its_cursor():
    bus = EventBus()
    ids = [bus.publish("bank.shared", {"n": i}) for i in range(5)]
    assert ids == [1, 2, 3, 4, 5] and bus.last_id == 5
    first = bus.read(0)
    assert [e.id for e in first.events] == ids and first.cursor == 5 and first.missed is None
    assert [e.data["n"] for e in bus.read(3).events] == [3, 4]
    assert bus.read(5).events == () and bus.read(5).cursor == 5
    assert EventBus().run != bus.run and re.fullmatch(r"[0-9a-f]{16}", bus.run)


def test_a_reader_the_ring_left_behind_is_told_exactly_which_ids_it_missed():
    bus = EventBus(capacity=10)
    for i in range(25):
        bus.publish("entry.accepted", {"n": i})
    batch = bus.read(0)
    assert batch.missed == (1, 15)
    assert [e.id for e in batch.events] == list(range(16, 26))
    assert bus.read(14).missed == (15, 15)
    assert bus.read(15).missed is None and len(bus.read(15).events) == 10
    assert EventBus(capacity=3).read(0) == type(batch)((), 0, None)  # an empty bus misses nothing


def test_the_types_filter_skips_other_events_and_still_advances_the_cursor():
    bus = EventBus()
    for t in ("entry.accepted", "entry.refused", "peer.lost", "entry.refused"):
        bus.publish(t, {})
    batch = bus.read(0, {"entry.refused"})
    assert [(e.id, e.type) for e in batch.events] == [(2, "entry.refused"), (4, "entry.refused")]
    assert batch.cursor == 4  # the next read does not look at 1..4 again
    assert bus.read(0, ()).events == () and bus.read(0, ()).cursor == 4


def test_an_unknown_type_is_a_bug_of_the_publisher_and_publishes_nothing():
    bus = EventBus()
    with pytest.raises(UnknownEventType, match="entry.accepted"):
        bus.publish("entry.maybe", {})
    assert bus.last_id == 0 and bus.read(0).events == ()


def test_many_threads_publishing_get_unique_ids_in_each_threads_order():
    bus = EventBus(capacity=100_000)
    per_thread, threads = 3000, 8
    got: dict[int, list[int]] = {}

    def publisher(t: int) -> None:
        got[t] = [bus.publish("entry.accepted", {"t": t, "i": i}) for i in range(per_thread)]

    workers = [threading.Thread(target=publisher, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    every = sorted(i for ids in got.values() for i in ids)
    assert every == list(range(1, per_thread * threads + 1))
    assert all(ids == sorted(ids) for ids in got.values())
    events = bus.read(0).events
    assert [e.id for e in events] == every  # the ring is in id order
    for t in range(threads):  # each thread's events in the order it published them
        assert [e.data["i"] for e in events if e.data["t"] == t] == list(range(per_thread))


async def test_a_subscriber_is_woken_on_its_loop_by_a_publish_from_another_thread():
    bus = EventBus()
    bus.attach(asyncio.get_running_loop())
    with bus.subscribe() as sub:
        sub.clear()
        assert await sub.wait(0.05) is False  # nothing published: a timeout
        publisher = threading.Thread(target=bus.publish, args=("peer.connected", {"peer": "k", "db": "d"}))
        publisher.start()
        assert await sub.wait(HANG_GUARD_S) is True  # woken by the publish (False only after the guard)
        publisher.join(HANG_GUARD_S)
        assert [e.type for e in bus.read(0).events] == ["peer.connected"]
        bus.close()
        sub.clear()
        assert await sub.wait(5) is True  # a closed bus never keeps a follower waiting


# ============================================================================ 2. the real app
class Sse:
    """A client of GET /v1/events: reads frames as they come, each with a deadline."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp
        self.comments: list[str] = []

    async def next(self, timeout: float = 5.0) -> dict[str, Any]:
        frame: dict[str, Any] = {}
        deadline = time.monotonic() + timeout  # for the whole frame: keepalives do not extend it
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no event within {timeout} s")
            line = (await asyncio.wait_for(self.resp.content.readline(), left)).decode()
            if line == "":
                raise EOFError("the stream ended")
            line = line.rstrip("\n")
            if line == "":
                if frame:
                    return frame
                continue
            if line.startswith(":"):
                self.comments.append(line)
                continue
            field, _, value = line.partition(": ")
            frame[field] = json.loads(value) if field == "data" else (int(value) if field == "id" else value)

    async def events(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        return [await self.next(timeout) for _ in range(n)]


class Harness:
    def __init__(self, base: str, token: str, session: aiohttp.ClientSession, node: Node, db: DbThread,
                 bus: EventBus) -> None:
        self.base, self.token, self.session, self.node, self.db, self.bus = base, token, session, node, db, bus

    def headers(self, token: str | None = "good") -> dict[str, str]:
        if token is None:
            return {}
        return {"Authorization": f"Bearer {self.token if token == 'good' else token}"}

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        async with self.session.post(self.base + path, json=body, headers=self.headers()) as resp:
            answer = await resp.json()
            assert resp.status == 200, answer
            return answer["data"]

    async def get(self, path: str, token: str | None = "good") -> tuple[int, str, str]:
        async with self.session.get(self.base + path, headers=self.headers(token)) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), await resp.text()

    def stream(self, query: str = "", token: str | None = "good", **headers: str) -> Any:
        return self.session.get(self.base + "/v1/events" + query, headers={**self.headers(token), **headers},
                                timeout=aiohttp.ClientTimeout(total=None, sock_read=None))


def _setup(home: Path) -> Node:
    node, _ = Node.init(home)
    node.run("embedder.set", {"provider": "none"})
    node.run("agent.new", {"name": "alpha"})
    node.run("memory.new", {"name": "notes", "description": "team notes"})
    node.run("memory.grant", {"bank": "notes", "agent": "alpha", "perm": "write"})
    return node


@pytest.fixture
async def live(tmp_path):
    """The API app exactly as serve builds it, with serve's bus and database watch."""
    home = tmp_path / "node"
    node = _setup(home)
    db = DbThread()
    loop = asyncio.get_running_loop()
    bus = EventBus(capacity=64)
    bus.attach(loop)
    watch = DatabaseWatch(node, bus.publish)
    await db.run(watch.start)
    runner = CommandRunner(node, db, {"pid": os.getpid(), "listen": "127.0.0.1:0"})
    app = build_app(runner.run, read_token(home), live=Live(bus, str(node.peer_key.public), keepalive_s=0.3))
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        with node.serving(Network(OnServeLoop(loop, db), events=bus)):
            async with aiohttp.ClientSession() as session:
                yield Harness(str(server.make_url("")).rstrip("/"), read_token(home), session, node, db, bus)
    finally:
        bus.close()
        await server.close()
        await db.run(watch.stop)
        db.stop()
        node.close()


async def test_events_and_metrics_need_the_token_and_health_does_not(live):
    for path in ("/v1/events", "/metrics"):
        for token in (None, "not-the-token"):
            status, ctype, body = await live.get(path, token)
            assert status == 401 and ctype.startswith("application/json"), (path, token, body)
            assert json.loads(body)["error"]["code"] == "unauthorized"
    status, ctype, body = await live.get("/v1/health", None)
    health = json.loads(body)
    assert status == 200 and ctype.startswith("application/json")
    assert health["ok"] is True and health["node_key"] == str(live.node.peer_key.public)
    assert set(health) == {"ok", "uptime_s", "node_key"} and 0 <= health["uptime_s"] < 60
    status, ctype, _ = await live.get("/metrics")
    assert status == 200 and ctype == "text/plain; version=0.0.4; charset=utf-8"


async def test_the_stream_says_hello_then_carries_what_the_node_does(live):
    async with live.stream("?since=0") as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        sse = Sse(resp)
        hello = await sse.next()
        assert hello == {"event": "hello", "data": {"run": live.bus.run, "last_id": live.bus.last_id}}
        entry = (await live.post("/v1/agents/alpha/tools/remember", {"key": "deploy", "value": "nix build",
                                                                     "bank": "notes"}))["entry"]
        [accepted] = await sse.events(1)
        assert accepted["event"] == "entry.accepted" and accepted["id"] == 1
        notes = live.node.agents.resolve("notes").db.id
        assert accepted["data"] == {"db": notes, "bank": "notes", "entry": entry, "source": "local",
                                    "author": live.node.database(notes).entry(entry).author_key}

        await live.post("/v1/agent/new", {"name": "beta"})
        await live.post("/v1/memory/grant", {"bank": "notes", "agent": "beta", "perm": "read"})
        frames = []
        while not any(f["event"] == "grant.changed" for f in frames):
            frames.append(await sse.next())
        [grant] = [f for f in frames if f["event"] == "grant.changed"]
        beta_key = live.node.agents.agent("beta").key.public
        assert grant["data"] == {"db": notes, "bank": "notes", "key": str(beta_key), "level": "read",
                                 "status": "active"}
        assert [f["id"] for f in frames] == sorted(f["id"] for f in frames)

        await live.post("/v1/memory/share", {"bank": "notes"})
        await live.post("/v1/memory/unshare", {"bank": "notes"})
        seen = []
        while len([f for f in seen if f["event"].startswith("bank.")]) < 2:
            seen.append(await sse.next())
        banks = [(f["event"], f["data"]) for f in seen if f["event"].startswith("bank.")]
        assert banks == [("bank.shared", {"db": notes, "bank": "notes"}),
                         ("bank.unshared", {"db": notes, "bank": "notes"})]
        # Quiet for longer than the keepalive: a comment keeps the connection open.
        with pytest.raises(asyncio.TimeoutError):
            await sse.next(timeout=0.8)
        assert ": keepalive" in sse.comments


async def test_a_refused_entry_is_an_event_with_its_reason_author_and_source(live):
    notes = live.node.agents.resolve("notes").db
    stranger = SigningKey.generate()
    forged = _forged_entry(stranger, notes.id, list(notes.heads))
    async with live.stream("?types=entry.refused") as resp:
        sse = Sse(resp)
        assert (await sse.next())["event"] == "hello"
        result = await live.db.run(lambda: notes.ingest([(forged.header, dict(forged.payloads))],
                                                         source="peer:ed25519:somebody"))
        [(entry_id, reason, _detail)] = result.rejected
        [refused] = await sse.events(1)
    assert refused["event"] == "entry.refused"
    assert refused["data"] == {"db": notes.id, "bank": "notes", "entry": forged.id, "author": str(stranger.public),
                               "source": "ed25519:somebody", "reason": reason}
    assert entry_id == forged.id

    # Bytes that do not even verify: the digest names them, no author.
    tampered = bytearray(forged.header)
    tampered[-1] ^= 1
    async with live.stream(f"?since={live.bus.last_id}&types=entry.refused") as resp:
        sse = Sse(resp)
        await sse.next()
        await live.db.run(lambda: notes.ingest([(bytes(tampered), dict(forged.payloads))], source="peer:x"))
        [bad] = await sse.events(1)
    assert bad["data"]["author"] is None and bad["data"]["reason"].startswith("entry.")
    assert bad["data"]["source"] == "x" and bad["data"]["entry"].startswith("sha256:")


async def test_since_resumes_without_loss_or_duplicates(live):
    for i in range(5):
        live.bus.publish("bank.shared", {"db": "d", "bank": f"b{i}"})
    got: list[int] = []
    async with live.stream("?since=0") as resp:
        sse = Sse(resp)
        assert (await sse.next())["data"]["last_id"] == 5
        got += [f["id"] for f in await sse.events(3)]
    # Published while nobody listens: the next connection picks up after the last id it saw.
    for i in range(5, 12):
        live.bus.publish("bank.unshared", {"db": "d", "bank": f"b{i}"})
    async with live.stream(f"?since={got[-1]}") as resp:
        sse = Sse(resp)
        await sse.next()
        got += [f["id"] for f in await sse.events(9)]
        threading.Thread(target=live.bus.publish, args=("peer.lost", {"peer": "p", "db": "d", "error": "e"})).start()
        got += [f["id"] for f in await sse.events(1)]
    assert got == list(range(1, 14))
    # The Last-Event-ID header (what an EventSource sends on reconnect) works as since does.
    async with live.stream(**{"Last-Event-ID": "12"}) as resp:
        sse = Sse(resp)
        await sse.next()
        [last] = await sse.events(1)
        assert last["id"] == 13 and last["event"] == "peer.lost"
    # Without since: only what happens from now on.
    async with live.stream() as resp:
        sse = Sse(resp)
        await sse.next()
        live.bus.publish("bank.shared", {"db": "d", "bank": "now"})
        [now] = await sse.events(1)
        assert now["id"] == 14


async def test_a_since_older_than_the_ring_gets_missed_first(live):
    for i in range(100):  # the fixture's ring holds 64
        live.bus.publish("entry.accepted", {"n": i})
    async with live.stream("?since=10") as resp:
        sse = Sse(resp)
        await sse.next()
        missed = await sse.next()
        assert missed == {"event": "missed", "data": {"from": 11, "to": 36}}
        first = await sse.next()
        assert first["id"] == 37 and first["data"] == {"n": 36}


@pytest.mark.parametrize("query, says", [
    ("?since=abc", "since is the id of the last event seen"),
    ("?since=-1", "since is the id"),
    ("?since=99", "after this serve run's last event"),
    ("?since=1&since=2", "give since once"),
    ("?types=entry.accepted,entry.maybe", "unknown: 'entry.maybe'"),
    ("?types=", "types is a comma-separated list"),
    ("?type=entry.accepted", "takes since and types, not type"),
])
async def test_a_bad_since_or_types_is_a_clear_400_and_changes_nothing(live, query, says):
    before = (live.bus.last_id, await live.db.run(lambda: {d: len(live.node.database(d))
                                                           for d in live.node.database_ids()}))
    status, ctype, body = await live.get("/v1/events" + query)
    assert status == 400 and ctype.startswith("application/json"), body
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_params" and says in error["message"], error
    assert (live.bus.last_id, await live.db.run(lambda: {d: len(live.node.database(d))
                                                         for d in live.node.database_ids()})) == before
    for path in ("/metrics?x=1", "/v1/health?x=1"):
        status, _, body = await live.get(path)
        assert status == 400 and json.loads(body)["error"]["code"] == "invalid_params"


async def test_metrics_parse_and_count_what_the_status_command_counts(live):
    notes = live.node.agents.resolve("notes").db
    forged = _forged_entry(SigningKey.generate(), notes.id, list(notes.heads))
    for source in ("peer:ed25519:one", "peer:ed25519:one", "peer:ed25519:two"):
        await live.db.run(lambda s=source: notes.ingest([(forged.header, dict(forged.payloads))], source=s))
    status, _, text = await live.get("/metrics")
    assert status == 200
    metrics = parse_metrics(text)
    async with live.session.get(live.base + "/v1/status", headers=live.headers()) as resp:
        data = (await resp.json())["data"]
    [d] = [d for d in data["databases"] if d["id"] == notes.id]
    [reason] = d["refused"]["peer:ed25519:one"]
    refused = metrics["memmesh_entries_refused_total"]
    assert refused[(("bank", "notes"), ("db", notes.id), ("peer", "ed25519:one"), ("reason", reason))] == 2
    assert refused[(("bank", "notes"), ("db", notes.id), ("peer", "ed25519:two"), ("reason", reason))] == 1
    assert metrics["memmesh_entries"][(("bank", "notes"), ("db", notes.id))] == d["entries"]
    assert TYPES_SEEN["memmesh_entries_refused_total"] == "counter"


# ---------------------------------------------------------------------- helpers
def _forged_entry(key: SigningKey, db_id: str, parents: list[str]):
    """A well-formed entry by ``key``, which the bank does not grant: signed, structurally valid."""
    c = client_id_for(key.public.raw)
    payload = encode_rows(c, 0, "memory", [(f"{c}/0", {"key": "forged", "value": "never stored", "tags": []})])
    return sign_entry(key, db=db_id, seq=0, prev=None, parents=parents, ts=int(time.time() * 1000),
                      payloads={"memory": (payload, 0, 1)})


TYPES_SEEN: dict[str, str] = {}
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')


def parse_metrics(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The Prometheus text format 0.0.4, strictly: every line a comment, a HELP/TYPE line or a
    sample; every sample of a family declared by TYPE first; labels quoted and escaped."""
    assert text.endswith("\n")
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "untyped", "summary", "histogram"), line
            TYPES_SEEN[name] = kind
            out.setdefault(name, {})
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, labels, value = match.groups()
        assert name in out, f"{name} has no TYPE line before its samples"
        pairs = tuple(sorted((k, re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), v))
                             for k, v in _LABEL.findall(labels or "")))
        assert "".join(f'{k}="' for k, _ in pairs) or not labels
        out[name][pairs] = float(value)
    return out


def test_every_event_type_is_documented_with_its_data():
    doc = (Path(__file__).parent.parent / "docs" / "api.md").read_text()
    section = doc.split("## Events, metrics and health", 1)[1]
    for t in EVENT_TYPES:
        assert f"`{t}`" in section, t


# ============================================================================ 3. a real serve
@pytest.mark.slow
def test_a_forged_entry_pushed_by_a_peer_is_on_the_stream_within_a_second_and_in_metrics(tmp_path):
    from memmesh.node.sync import messages as m
    from memmesh.node.sync.http import HttpTransport, call
    from memmesh.node.sync.protocol import Client
    from tests.procs import processes

    home = tmp_path / "node"
    _setup(home).close()
    reader, stranger = SigningKey.generate(), SigningKey.generate()
    with processes() as procs:
        s = procs.serve(home, interval=60).start().wait_ready()
        [db_id] = [b["id"] for b in s.run("memory.list", {}).data["banks"] if b["name"] == "notes"]
        s.run("memory.share", {"bank": "notes", "perm": "read", "recipient": str(reader.public)})  # reader: Read
        base, token = f"http://{s.info['api']}", read_token(home)
        [bank] = [d for d in s.run("status", {}).data["databases"] if d["id"] == db_id]
        forged = _forged_entry(stranger, db_id, bank["heads"])

        async def scenario() -> tuple[dict[str, Any], float, str, tuple[int, str]]:
            auth = {"Authorization": f"Bearer {token}"}
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{base}/v1/health") as resp:  # no token
                    health = (resp.status, (await resp.json())["node_key"])
                async with session.get(f"{base}/v1/events?types=entry.refused", headers=auth,
                                       timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as resp:
                    sse = Sse(resp)
                    assert (await sse.next())["event"] == "hello"
                    push = m.PushRequest(db_id, [(forged.header, dict(forged.payloads))])
                    _key, reply = await call(HttpTransport(session, timeout=HANG_GUARD_S), Client(reader),
                                             s.address, s.node_key, push)
                    # "at once": the event is on the bus before the push is answered (published as
                    # the entry is refused, not by a later pass: serve's interval is 60 s here),
                    # so a stream opened now already counts it in its hello's last_id.
                    async with session.get(f"{base}/v1/events?types=entry.refused", headers=auth,
                                           timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as after:
                        after_hello = await Sse(after).next(timeout=HANG_GUARD_S)
                    refused = await sse.next(timeout=HANG_GUARD_S)
                async with session.get(f"{base}/metrics", headers=auth) as resp:
                    assert resp.status == 200
                    text = await resp.text()
            assert sum(reply.refused.values()) == 1, reply
            return refused, after_hello, text, health

        refused, after_hello, text, health = asyncio.run(scenario())
        assert health == (200, s.node_key)
        assert refused["event"] == "entry.refused"
        assert after_hello["event"] == "hello" and after_hello["data"]["last_id"] >= refused["id"], after_hello
        data = refused["data"]
        assert (data["entry"], data["author"], data["source"], data["db"]) == \
            (forged.id, str(stranger.public), str(reader.public), db_id)
        assert data["reason"].startswith(("auth.", "entry.")), data
        metrics = parse_metrics(text)["memmesh_entries_refused_total"]
        assert metrics[(("bank", "notes"), ("db", db_id), ("peer", str(reader.public)),
                        ("reason", data["reason"]))] == 1
        explained = s.run("explain", {"entry_id": forged.id}).text
        assert data["reason"] in explained
        assert s.stop() == 0
    print(f"\nforged entry on the event stream (event {refused['id']}): {data['reason']}")



@pytest.mark.slow
def test_peer_and_lag_events_follow_a_real_link_between_two_serves(tmp_path):
    """B imports A's bank: B's stream shows the import, the peer connecting, a write of B's
    lagging on A until the push and none after, then A gone (peer.lost) and the lag it leaves."""
    from tests.procs import processes, until

    a_home, b_home = tmp_path / "a", tmp_path / "b"
    _setup(a_home).close()
    Node.init(b_home)[0].close()
    with processes() as procs:
        a = procs.serve(a_home, interval=0.5).start()
        b = procs.serve(b_home, interval=0.5).start()
        a.wait_ready(), b.wait_ready()
        ticket = a.run("memory.share", {"bank": "notes", "perm": "admin"}).data["ticket"]
        base, token = f"http://{b.info['api']}", read_token(b_home)

        async def scenario() -> list[dict[str, Any]]:
            frames: list[dict[str, Any]] = []

            async def until_event(sse: Sse, pred: Any, timeout: float = 15.0) -> dict[str, Any]:
                deadline = time.monotonic() + timeout
                while True:
                    f = await sse.next(max(0.01, deadline - time.monotonic()))
                    frames.append(f)
                    if pred(f):
                        return f

            async with aiohttp.ClientSession() as session:
                async with session.get(f"{base}/v1/events", headers={"Authorization": f"Bearer {token}"},
                                       timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as resp:
                    sse = Sse(resp)
                    await sse.next()
                    db_id = (await asyncio.to_thread(b.run, "memory.import", {"ticket": ticket, "perm": "admin"})
                             ).data["db"]
                    await until_event(sse, lambda f: f["event"] == "bank.imported")
                    await until_event(sse, lambda f: f["event"] == "peer.connected" and f["data"]["db"] == db_id)
                    for name, params in (("agent.new", {"name": "gamma"}),
                                         ("memory.grant", {"bank": "notes", "agent": "gamma", "perm": "write"})):
                        await asyncio.to_thread(b.run, name, params)
                    await asyncio.to_thread(b.run, "remember", {"agent": "gamma", "key": "k",
                                                                "value": "the deploy runs on Tuesdays", "bank": "notes"})
                    up = await until_event(sse, lambda f: f["event"] == "lag.changed" and f["data"]["peer_lacks"] > 0)
                    await until_event(sse, lambda f: f["event"] == "lag.changed" and f["data"]["peer_lacks"] == 0)
                    a.kill()
                    lost = await until_event(sse, lambda f: f["event"] == "peer.lost")
                    # Another fact altogether: not a near-duplicate of the first (docs/memory.md).
                    await asyncio.to_thread(b.run, "remember", {"agent": "gamma", "key": "k2",
                                                                "value": "lunch is at noon in the canteen", "bank": "notes"})
                    behind = await until_event(sse, lambda f: f["event"] == "lag.changed"
                                               and f["data"]["peer_lacks"] > 0)
                    assert up["data"]["peer"] == lost["data"]["peer"] == behind["data"]["peer"] == a.node_key
                    assert lost["data"]["error"] and lost["data"]["db"] == db_id
            return frames

        frames = asyncio.run(scenario())
        ids = [f["id"] for f in frames]
        assert ids == sorted(set(ids)), ids
        status = until(lambda: [p for d in b.run("status", {}).data["databases"]
                                for p in (d.get("sync") or {}).get("peers", [])], 5, "B's status lists A")
        last_lag = [f for f in frames if f["event"] == "lag.changed"][-1]["data"]
        [peer] = [p for p in status if p["peer"] == a.node_key]
        assert (peer["peer_lacks"], peer["we_lack"]) == (last_lag["peer_lacks"], last_lag["we_lack"])

        async def stop_while_streaming() -> int:
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{base}/v1/events", headers={"Authorization": f"Bearer {token}"}) as resp:
                    sse = Sse(resp)
                    await sse.next()
                    code = await asyncio.to_thread(b.stop)
                    # An open stream does not hold serve's drain: serve ends it itself (bus.close),
                    # so the stream ends cleanly (EOF after the last chunk). Held until the drain
                    # gave up (DRAIN_S), its handler would be cancelled and the connection cut
                    # mid-stream: aiohttp.ClientPayloadError, which fails this test.
                    with pytest.raises(EOFError):
                        await sse.next(timeout=HANG_GUARD_S)
                    return code

        assert asyncio.run(stop_while_streaming()) == 0
        assert "info stop " in b.log(), b.log()[-2000:]  # it went all the way through its shutdown
