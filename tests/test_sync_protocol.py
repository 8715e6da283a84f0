"""The sans-IO sync protocol, driven without sockets: signed requests and responses, the feeds
round trip, pull and push pages, peer exchange, and every way a request can be refused."""
from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memmesh.auth.permissions import holds
from memmesh.crdt.database import Database
from memmesh.crdt.storage import MemoryStorage
from memmesh.node.sync import messages as m
from memmesh.node.sync.envelope import H_NONCE, H_SIGNATURE, H_TIME, sign_request
from memmesh.node.sync.protocol import Client, Exchange, SyncError, SyncServer, hello
from tests.dbkit import craft, grant, key, new_db, rows_update, state, write

ADMIN, ALICE, BOB = key(1), key(2), key(3)
PEER_A, PEER_B, STRANGER = key(41), key(42), key(43)


class Node:
    """A ServedNode over a dict of databases: served to keys holding at least Read."""

    def __init__(self) -> None:
        self.dbs: dict[str, Database] = {}
        self.peers: dict[str, list[m.PeerInfo]] = {}
        self.learnt: list[tuple[str, str, list[m.PeerInfo]]] = []

    def readable(self, db_id, caller):
        db = self.dbs.get(db_id)
        return db if db is not None and holds(db.permission(caller), "read") else None

    def peers_of(self, db_id, caller):
        return [p for p in self.peers.get(db_id, []) if p.key != caller]

    def learn_peers(self, db_id, caller, peers):
        self.learnt.append((db_id, caller, peers))

    def redeem(self, db_id, caller, ticket, perm, proof):
        return None


def _fresh(db_id: str) -> Database:
    storage = MemoryStorage()
    storage.add_database(db_id)
    return Database(storage, db_id)


def _send(client: Client, server: SyncServer, target: str, message, now=None):
    out = client.request(target, message)
    r = out.request
    resp = server.handle(r.method, r.path, r.headers, r.body, now)
    return client.reply(out, resp.status, resp.headers, resp.body)[1]


def _run(exchange: Exchange, client: Client, server: SyncServer, target: str) -> int:
    rounds = 0
    while (msg := exchange.next_message()) is not None:
        exchange.on_reply(_send(client, server, target, msg))
        rounds += 1
        assert rounds < 1000
    return rounds


@pytest.fixture
def bank():
    db = new_db(ADMIN)
    grant(db, ADMIN, ALICE, "write")
    grant(db, ADMIN, BOB, "write")
    grant(db, ADMIN, PEER_A, "read")
    for i in range(30):
        write(db, ALICE, {"key": f"k{i}", "value": "v" * 100})
    return db


def _server(db: Database) -> tuple[SyncServer, Node]:
    node = Node()
    node.dbs[db.id] = db
    return SyncServer(PEER_B, node), node


def test_bootstrap_and_both_directions(bank):
    server, _ = _server(bank)
    client = Client(PEER_A)
    mine = _fresh(bank.id)
    ex = Exchange(mine, str(PEER_B.public), page_bytes=1500)
    _run(ex, client, server, str(PEER_B.public))
    assert state(mine) == state(bank)
    assert ex.stats.lacking == len(bank) and ex.stats.pages > 3 and ex.stats.pulled == len(bank)
    # New writes on both sides: one exchange brings both up to date.
    write(bank, ALICE, {"key": "from b", "value": "1"})
    write(mine, BOB, {"key": "from a", "value": "2"})  # one key writes from one place
    ex = Exchange(mine, str(PEER_B.public))
    rounds = _run(ex, client, server, str(PEER_B.public))
    assert state(mine) == state(bank) and ex.stats.pulled == 1 and ex.stats.pushed == 1
    assert rounds == 3  # feeds, one pull page, one push page
    # In sync: the feeds round trip alone.
    ex = Exchange(mine, str(PEER_B.public))
    assert _run(ex, client, server, str(PEER_B.public)) == 1


def test_a_database_that_is_not_readable_answers_like_one_that_does_not_exist(bank):
    server, node = _server(bank)
    stranger = Client(STRANGER)
    target = str(PEER_B.public)
    with pytest.raises(SyncError) as no_read:
        _send(stranger, server, target, m.FeedsRequest(bank.id, {}))
    with pytest.raises(SyncError) as no_db:
        _send(stranger, server, target, m.FeedsRequest("sha256:" + "ab" * 32, {}))
    assert (no_read.value.status, no_read.value.reason, str(no_read.value)) == \
           (no_db.value.status, no_db.value.reason, str(no_db.value)) == (404, "sync.not_found", str(no_db.value))
    # The raw bodies are identical too.
    bodies = []
    for db_id in (bank.id, "sha256:" + "ab" * 32):
        out = stranger.request(target, m.PullRequest(db_id, {}))
        r = out.request
        bodies.append(server.handle(r.method, r.path, r.headers, r.body).body)
    assert bodies[0] == bodies[1]
    # Nor can it push.
    with pytest.raises(SyncError, match="no such database"):
        _send(stranger, server, target, m.PushRequest(bank.id, []))


def _raw(server: SyncServer, req, headers=None, body=None, now=None):
    return server.handle(req.method, req.path, headers if headers is not None else req.headers,
                         body if body is not None else req.body, now)


def _error(resp) -> str:
    return m.ErrorReply.decode(m.unpack(resp.body)).error


def test_refused_requests(bank):
    server, _ = _server(bank)
    client = Client(PEER_A)
    target = str(PEER_B.public)
    good = client.request(target, m.FeedsRequest(bank.id, {})).request
    # unsigned
    unsigned = {k: v for k, v in good.headers.items() if k != H_SIGNATURE}
    resp = _raw(server, good, unsigned)
    assert (resp.status, _error(resp)) == (401, "sync.unauthenticated")
    # wrongly signed: the body changed after signing
    tampered = _raw(server, good, body=good.body + b"\x00")
    assert (tampered.status, _error(tampered)) == (401, "sync.unauthenticated")
    # signed by someone else's key under PEER_A's name
    forged = sign_request(STRANGER, "POST", good.path, good.body, target, int(good.headers[H_TIME]))
    headers = dict(forged.headers, **{"memmesh-key": str(PEER_A.public)})
    assert _error(_raw(server, forged, headers)) == "sync.unauthenticated"
    # for another node
    other = client.request(str(STRANGER.public), m.FeedsRequest(bank.id, {})).request
    assert _error(_raw(server, other)) == "sync.wrong_target"
    # outside the time window
    old = sign_request(PEER_A, "POST", good.path, good.body, target, int(good.headers[H_TIME]) - 10 * 60_000)
    assert _error(_raw(server, old)) == "sync.stale"
    # replayed: the same request twice
    assert _raw(server, good).status == 200
    replay = _raw(server, good)
    assert (replay.status, _error(replay)) == (401, "sync.replay")
    # a malformed body, properly signed
    junk = sign_request(PEER_A, "POST", good.path, b"\xc1\xc1", target, client.clock())
    resp = _raw(server, junk)
    assert (resp.status, _error(resp)) == (400, "sync.bad_message")
    # a nonce that is not hex
    bad_nonce = dict(client.request(target, m.FeedsRequest(bank.id, {})).request.headers, **{H_NONCE: "zz" * 16})
    assert _error(_raw(server, good, bad_nonce)) == "sync.unauthenticated"


def test_client_refuses_an_answer_from_another_node(bank):
    impostor, _ = _server(bank)
    impostor.key = STRANGER  # answers with its own key for requests meant for PEER_B
    impostor.verifier.node_key = str(PEER_B.public)
    client = Client(PEER_A)
    with pytest.raises(SyncError) as err:
        _send(client, impostor, str(PEER_B.public), m.FeedsRequest(bank.id, {}))
    assert err.value.reason == "sync.wrong_node"


def test_hello_learns_the_node_key(bank):
    server, _ = _server(bank)
    client = Client(STRANGER)
    out = hello(client)
    resp = server.handle(out.request.method, out.request.path, out.request.headers, out.request.body)
    node_key, reply = client.reply(out, resp.status, resp.headers, resp.body)
    assert node_key == str(PEER_B.public) and reply.version == 1
    # Only hello may leave the target open.
    out = Client(PEER_A).request("*", m.FeedsRequest(bank.id, {}))
    r = out.request
    assert _error(server.handle(r.method, r.path, r.headers, r.body)) == "sync.wrong_target"


def test_pushing_invalid_entries_stores_nothing_and_backs_the_peer_off(bank):
    server, _ = _server(bank)
    client = Client(PEER_A)
    target = str(PEER_B.public)
    before = {s.id for s in bank.storage.entries(bank.id)}
    forged = craft(bank, STRANGER, {"memory": rows_update(STRANGER, "memory", 0, [{"key": "x", "value": "y"}])}, seq=0, prev=None)
    bad_sig = bytearray(forged.header)
    bad_sig[-1] ^= 1
    junk = [(bytes(bad_sig), dict(forged.payloads)), (forged.header, dict(forged.payloads)), (b"\x00" * 80, {})]
    reply = _send(client, server, target, m.PushRequest(bank.id, junk))
    assert reply.stored == 0 and reply.refused == {"entry.signature": 1, "auth.unknown_key": 1, "entry.format": 1}
    assert {s.id for s in bank.storage.entries(bank.id)} == before
    counts = bank.refusal_counts()[f"peer:{PEER_A.public}"]
    assert counts == {"entry.signature": 1, "auth.unknown_key": 1, "entry.format": 1}
    for _ in range(20):
        try:
            _send(client, server, target, m.PushRequest(bank.id, junk))
        except SyncError as exc:
            assert (exc.status, exc.reason) == (429, "sync.backoff")
            break
    else:
        pytest.fail("a peer that keeps pushing invalid entries is never backed off")
    assert server.backoff.status(str(PEER_A.public), client.clock())["backoff_ms"] > 0
    assert {s.id for s in bank.storage.entries(bank.id)} == before


def test_peer_exchange(bank):
    server, node = _server(bank)
    node.peers[bank.id] = [m.PeerInfo(str(STRANGER.public), ("http:10.0.0.9:7411",)),
                           m.PeerInfo(str(PEER_A.public), ("http:127.0.0.1:1",))]
    mine = _fresh(bank.id)
    ex = Exchange(mine, str(PEER_B.public), known_peers=[m.PeerInfo(str(ALICE.public), ("http:127.0.0.1:9",))])
    _run(ex, Client(PEER_A), server, str(PEER_B.public))
    assert [p.key for p in ex.stats.peers] == [str(STRANGER.public)]  # never the caller itself
    assert node.learnt == [(bank.id, str(PEER_A.public), [m.PeerInfo(str(ALICE.public), ("http:127.0.0.1:9",))])]


def test_a_chain_a_b_c_converges(bank):
    """A -> B -> C with writes everywhere: two exchanges per link converge all three."""
    b = _fresh(bank.id)
    c = _fresh(bank.id)
    grant(bank, ADMIN, PEER_B, "read")
    grant(bank, ADMIN, key(44), "read")
    server_a, _ = _server(bank)
    node_b = Node()
    node_b.dbs[bank.id] = b
    server_b = SyncServer(PEER_B, node_b)
    for _ in range(2):
        _run(Exchange(b, str(PEER_B.public)), Client(PEER_B), server_a, str(PEER_B.public))
        _run(Exchange(c, str(PEER_B.public)), Client(key(44)), server_b, str(PEER_B.public))
        if len(c) and not any(r.value.get("key") == "from c" for r in c.rows("memory")):
            write(c, BOB, {"key": "from c", "value": "c"})
    _run(Exchange(b, str(PEER_B.public)), Client(PEER_B), server_a, str(PEER_B.public))
    assert state(bank) == state(b) == state(c)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(m.REQUESTS)), st.binary(max_size=300))
def test_decoding_untrusted_bytes_only_ever_refuses(op, body):
    try:
        m.decode_request(op, body)
    except m.MessageError as exc:
        assert exc.reason.startswith("sync.")


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_decoding_mutated_messages_only_ever_refuses(data):
    db_id = "sha256:" + "11" * 32
    body = m.pack(m.PullRequest(db_id, {str(ALICE.public): (3, "sha256:" + "22" * 32)}, {}, ("sha256:" + "33" * 32,),
                                (4, "sha256:" + "44" * 32), 1000).encode())
    mutated = bytearray(body)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(mutated) - 1))
        mutated[i] = data.draw(st.integers(0, 255))
    with contextlib.suppress(m.MessageError):
        m.decode_request("pull", bytes(mutated))


def test_signed_request_vector():
    """docs/protocol.md section 6.4 shows exactly what the code signs."""
    import re
    from pathlib import Path

    from memmesh.auth.keys import SigningKey
    from memmesh.node.sync.envelope import request_message

    doc = (Path(__file__).resolve().parent.parent / "docs" / "protocol.md").read_text()
    block = doc.split("<!-- sync-request-vector -->", 1)[1].split("```")[1]
    shown = dict(re.findall(r"^(\S+)\s+(\S+)$", block, re.M))
    caller = SigningKey.from_seed(bytes(range(32)))
    node = SigningKey.from_seed(bytes(range(32, 64)))
    db = "sha256:4120585c810070fad66f663aa6781039ece449ca4ee78c6c4ffde5acb38b7c9d"
    body = m.pack(m.FeedsRequest(db, {str(caller.public): (0, db)}, {}).encode())
    req = sign_request(caller, "POST", "/sync/v1/feeds", body, str(node.public), 1764460800000, bytes(range(16)))
    assert shown["body"] == body.hex()
    assert shown["signed"] == request_message("POST", "/sync/v1/feeds", body, node.public.raw, 1764460800000,
                                              bytes(range(16))).hex()
    assert shown["memmesh-signature"] == req.headers["memmesh-signature"]
    assert str(node.public) in doc and str(caller.public) in doc


def test_a_payload_that_has_not_arrived_is_fetched_again(bank):
    """A header taken in without its payload (under an erase that is not valid) is refetched
    whole by the next exchange and filled in."""
    from memmesh.crdt.erasure import ERASE, EraseOp

    target = next(r.entry_id for r in bank.rows("memory"))
    forged = craft(bank, BOB, {ERASE: rows_update(BOB, ERASE, 0, [EraseOp(target, "memory", str(ALICE.public)).value()])})
    mine = _fresh(bank.id)
    entries = [(s.header, {k: (None if s.id == target and k == "memory" else v) for k, v in s.payloads.items()})
               for s in bank.storage.entries(bank.id)]
    mine.ingest(entries + [(forged.header, dict(forged.payloads))])
    assert mine.payload_state(target, "memory") == "pending"
    bank.ingest([(forged.header, dict(forged.payloads))])
    server, _ = _server(bank)
    _run(Exchange(mine, str(PEER_B.public)), Client(PEER_A), server, str(PEER_B.public))
    assert mine.payload_state(target, "memory") == "present" and state(mine) == state(bank)


def test_a_large_pulled_page_is_taken_in_slices(bank, monkeypatch):
    """A pulled page is ingested a slice at a time (the driver runs each slice as its own job
    on the database thread, so other work runs in between); the result is the same as whole."""
    import memmesh.node.sync.protocol as protocol
    monkeypatch.setattr(protocol, "SLICE_S", 0.0)  # every chunk ends a slice
    monkeypatch.setattr(protocol, "PUSH_SLICE_ENTRIES", 8)
    server, _ = _server(bank)
    client = Client(PEER_A)
    mine = _fresh(bank.id)
    ex = Exchange(mine, str(PEER_B.public))
    target = str(PEER_B.public)
    ex.on_reply(_send(client, server, target, ex.next_message()))  # feeds
    ex.on_reply(_send(client, server, target, ex.next_message()))  # one pull page: every entry
    slices = 1
    while ex.working():
        ex.work()
        slices += 1
    assert slices == -(-len(bank) // protocol.PUSH_SLICE_ENTRIES) > 1
    assert ex.stats.pulled == len(bank) and state(mine) == state(bank)
    assert ex.next_message() is None and ex.done
