"""PeerBook: the peers a node knows per database (bounded, never itself, backoff with jitter,
uniform bounded choice, msgpack persistence)."""
from __future__ import annotations

import random
from collections import Counter

import msgpack
import pytest

from memmesh.node.sync.peerbook import CAP_MS, PeerBook, PeerBookError, PeerRecord
from tests.dbkit import key_str

DB = "sha256:" + "ab" * 32
DB2 = "sha256:" + "cd" * 32
ME = key_str("me")


def k(i: int) -> str:
    return key_str(f"peer-{i}")


def addr(i: int) -> str:
    return f"http:10.0.{i // 256}.{i % 256}:7411"


def book(**kw) -> PeerBook:
    return PeerBook(ME, rnd=random.Random(7), **kw)


def test_add_keeps_addresses_most_recent_first_and_every_way():
    b = book()
    rec = b.add(DB, k(1), [addr(1)], "ticket", 100)
    assert rec == PeerRecord(k(1), (addr(1),), "ticket", frozenset({"ticket"}), 100, 100)
    b.add(DB, k(1), [addr(2), addr(1)], "lan", 200)
    rec = b.get(DB, k(1))
    assert rec.addrs == (addr(2), addr(1)) and rec.how == "ticket" and rec.ways == {"ticket", "lan"}
    assert (rec.first_seen, rec.last_seen) == (100, 200)
    b.add(DB, k(1), [addr(i) for i in range(10, 20)], "manual", 300)
    rec = b.get(DB, k(1))
    assert rec.addrs == tuple(addr(i) for i in range(10, 18))  # at most 8, the newest
    assert [r.key for r in b.peers(DB)] == [k(1)] and b.peers(DB2) == [] and b.databases() == [DB]


def test_hearsay_never_pushes_known_addresses_out():
    """Peer exchange is hearsay: a reader naming a peer with made-up addresses adds them after
    the ones known (room permitting), never in front of them or in their place."""
    b = book()
    b.add(DB, k(1), [addr(1), addr(2)], "ticket", 100)
    b.add(DB, k(1), [addr(i) for i in range(100, 110)], "exchange", 200)
    assert b.get(DB, k(1)).addrs == (addr(1), addr(2), *(addr(i) for i in range(100, 106)))
    b.add(DB, k(1), [addr(3)], "lan", 300)  # what the peer says of itself still comes first
    assert b.get(DB, k(1)).addrs[:3] == (addr(3), addr(1), addr(2))


def test_never_the_node_itself():
    b = book()
    assert b.add(DB, ME, [addr(0)], "lan", 1) is None
    assert b.peers(DB) == []
    b.add(DB, k(1), [addr(1)], "exchange", 1)
    assert all(r.key != ME for r in b.choose(DB, 5, 10, random.Random(1)))
    # nor after a round trip through bytes that claim otherwise
    raw = msgpack.unpackb(b.to_bytes())
    raw["dbs"][DB].append([ME, [addr(0)], "lan", ["lan"], 1, 1, None, None, 0, 0])
    again = PeerBook.from_bytes(msgpack.packb(raw))
    assert [r.key for r in again.peers(DB)] == [k(1)]


def test_malformed_input_is_refused():
    b = book()
    with pytest.raises(PeerBookError, match="how"):
        b.add(DB, k(1), [addr(1)], "rumour", 1)
    with pytest.raises(PeerBookError, match="peer key"):
        b.add(DB, "ed25519:nope", [addr(1)], "manual", 1)
    with pytest.raises(PeerBookError, match="address"):
        b.add(DB, k(1), ["ftp://x"], "manual", 1)
    with pytest.raises(PeerBookError, match="sequence"):
        b.add(DB, k(1), addr(1), "manual", 1)
    assert b.peers(DB) == []


def test_bounded_evicting_the_least_recently_seen_that_is_not_from_a_ticket():
    b = book(max_peers=256)
    for i in range(4):
        b.add(DB, k(i), [addr(i)], "ticket", i)
    for i in range(4, 256):
        b.add(DB, k(i), [addr(i)], "exchange", i)
    b.record_success(DB, k(4), 1000)  # seen: no longer the least recently seen
    b.add(DB, k(5), [addr(5)], "exchange", 2000)  # a hint does not count as seen
    for i in range(256, 260):
        assert b.add(DB, k(i), [addr(i)], "exchange", i) is not None
    keys = {r.key for r in b.peers(DB)}
    assert len(keys) == 256
    assert {k(0), k(1), k(2), k(3), k(4)} <= keys  # tickets stay; k(4) was seen
    assert not keys & {k(5), k(6), k(7), k(8)}  # the four least recently seen went
    assert k(9) in keys and k(259) in keys
    assert len(b.peers(DB2)) == 0  # per database


def test_a_book_full_of_tickets_lets_only_tickets_in():
    b = book(max_peers=3)
    for i in range(3):
        b.add(DB, k(i), [addr(i)], "ticket", 10 - i)
    assert b.add(DB, k(9), [addr(9)], "exchange", 20) is None
    assert b.add(DB, k(8), [addr(8)], "ticket", 20) is not None
    assert {r.key for r in b.peers(DB)} == {k(0), k(1), k(8)}  # k(2) was seen least recently


def test_a_peer_that_becomes_a_ticket_peer_is_no_longer_evictable():
    b = book(max_peers=2)
    b.add(DB, k(1), [addr(1)], "exchange", 1)
    b.add(DB, k(2), [addr(2)], "exchange", 2)
    b.add(DB, k(1), [addr(1)], "ticket", 3)
    b.add(DB, k(3), [addr(3)], "exchange", 4)
    assert {r.key for r in b.peers(DB)} == {k(1), k(3)}


def test_backoff_doubles_with_jitter_up_to_five_minutes_and_success_clears_it():
    b = book()
    b.add(DB, k(1), [addr(1)], "manual", 0)
    now = 1_000_000
    waits = []
    for n in range(1, 14):
        rec = b.record_failure(DB, k(1), now, "connection refused")
        d = min(CAP_MS, 1000 * 2 ** (n - 1))
        assert d // 2 <= rec.next_try_ms - now <= d
        assert rec.failures == n and rec.last_error == "connection refused"
        waits.append(rec.next_try_ms - now)
    assert max(waits) <= CAP_MS and waits[-1] >= CAP_MS // 2
    assert len(set(waits[-4:])) > 1  # jittered, not lockstep
    assert b.choose(DB, 3, now + 1, random.Random(1)) == []
    assert [r.key for r in b.choose(DB, 3, now + CAP_MS, random.Random(1))] == [k(1)]
    rec = b.record_success(DB, k(1), now + 5)
    assert (rec.failures, rec.next_try_ms, rec.last_success, rec.last_seen) == (0, 0, now + 5, now + 5)
    assert rec.last_error == "connection refused"  # kept for status: the last error seen
    assert b.record_failure(DB, k(99), now, "x") is None and b.record_success(DB2, k(1), now) is None
    assert len(b.record_failure(DB, k(1), now, "e" * 1000).last_error) == 200


def test_backoff_is_seeded():
    def waits(seed: int) -> list[int]:
        b = PeerBook(ME, rnd=random.Random(seed))
        b.add(DB, k(1), [addr(1)], "manual", 0)
        return [b.record_failure(DB, k(1), 0, "x").next_try_ms for _ in range(8)]

    assert waits(3) == waits(3) != waits(4)


def test_a_new_first_hand_address_ends_the_backoff_a_hint_does_not():
    b = book()
    b.add(DB, k(1), [addr(1)], "ticket", 0)
    b.record_failure(DB, k(1), 100, "timeout")
    b.record_failure(DB, k(1), 100, "timeout")
    b.add(DB, k(1), [addr(2)], "exchange", 200)
    assert b.get(DB, k(1)).backing_off(200)
    b.add(DB, k(1), [addr(3)], "lan", 300)
    assert not b.get(DB, k(1)).backing_off(300) and b.get(DB, k(1)).addrs[0] == addr(3)


def test_choose_is_a_bounded_uniform_draw_among_peers_not_backing_off():
    b = book()
    for i in range(20):
        b.add(DB, k(i), [addr(i)], "exchange", 0)
    for i in range(5):
        b.record_failure(DB, k(i), 0, "timeout")
    rnd = random.Random(11)
    counts: Counter[str] = Counter()
    for _ in range(3000):
        chosen = b.choose(DB, 3, 10, rnd)
        assert len(chosen) == 3 and len({r.key for r in chosen}) == 3
        counts.update(r.key for r in chosen)
    assert set(counts) == {k(i) for i in range(5, 20)}
    assert max(counts.values()) < 1.25 * 600 and min(counts.values()) > 0.75 * 600  # 9000 / 15
    assert len(b.choose(DB, 50, 10, rnd)) == 15
    assert b.choose(DB, 0, 10, rnd) == [] and b.choose(DB2, 3, 10, rnd) == []


def test_infos_tell_every_peer_or_a_sample_never_the_one_asked():
    b = book()
    for i in range(10):
        b.add(DB, k(i), [addr(i)], "exchange", 0)
    assert [p.key for p in b.infos(DB, exclude=k(3))] == [k(i) for i in range(10) if i != 3]
    sample = b.infos(DB, exclude=k(3), k=4, rnd=random.Random(2))
    assert len(sample) == 4 and k(3) not in {p.key for p in sample}
    assert all(p.addrs == b.get(DB, p.key).addrs for p in sample)


def test_persistence_round_trip():
    b = book(max_peers=5)
    b.add(DB, k(1), [addr(1), addr(11)], "ticket", 5)
    b.add(DB, k(2), [addr(2)], "exchange", 6)
    b.add(DB, k(3), [addr(3)], "lan", 7)
    b.add(DB, k(3), [addr(3)], "exchange", 8)
    b.record_failure(DB, k(2), 50, "reply lost")
    b.record_success(DB, k(3), 60)
    b.add(DB2, k(4), [], "manual", 9)
    again = PeerBook.from_bytes(b.to_bytes(), rnd=random.Random(1), max_peers=5)
    assert again.self_key == ME
    for db in (DB, DB2):
        assert again.peers(db) == b.peers(db)
    # the eviction order survives: k(2) (seen at 6) goes before k(3) (seen at 60)
    for i in range(5, 8):
        again.add(DB, k(i), [addr(i)], "exchange", 100 + i)
    assert {r.key for r in again.peers(DB)} == {k(1), k(3), k(5), k(6), k(7)}
    assert again.to_bytes() != b.to_bytes()


def _row(*fields) -> bytes:
    return msgpack.packb({"v": 1, "self": None, "dbs": {DB: [list(fields)]}})


@pytest.mark.parametrize("data", [
    b"", b"\xc1", msgpack.packb([1, 2]), msgpack.packb({"v": 2, "self": None, "dbs": {}}),
    _row(k(1)),
    _row(k(1), [addr(1)], "gossip", ["gossip"], 1, 1, None, None, 0, 0),
    _row(k(1), ["x"], "lan", ["lan"], 1, 1, None, None, 0, 0),
    _row(k(1), [addr(1)], "lan", ["lan"], -1, 1, None, None, 0, 0),
    _row(k(1), [addr(1)], "lan", ["manual"], 1, 1, None, None, 0, 0),
    _row("ed25519:x", [addr(1)], "lan", ["lan"], 1, 1, None, None, 0, 0),
])
def test_malformed_persisted_books_are_refused(data):
    with pytest.raises(PeerBookError):
        PeerBook.from_bytes(data)


def test_remove_and_forget():
    b = book()
    b.add(DB, k(1), [addr(1)], "exchange", 0)
    b.add(DB2, k(1), [addr(1)], "exchange", 0)
    assert b.remove(DB, k(1)) and not b.remove(DB, k(1))
    assert b.peers(DB) == [] and len(b) == 1
    b.forget(DB2)
    assert len(b) == 0 and b.databases() == []
