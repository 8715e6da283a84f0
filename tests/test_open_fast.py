"""Opening a database without decoding payloads that passed their checks before (issue 23).

What open derives must not depend on whether payloads carry a "checked" mark
(crdt/open_marks.py): the same shown rows, the same hidden rows, the same damage found. Marks
of another checks version or of another entry are no marks. Row keys held as clock ranges
(crdt/row_keys.py) must compare exactly as the key strings do.
"""
from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memmesh.crdt.database import Database
from memmesh.crdt.entry import client_id_for
from memmesh.crdt.errors import DamagedError
from memmesh.crdt.open_marks import CHECKS_VERSION, decode_mark, encode_mark, namespace, read_marks
from memmesh.crdt.prefetch import mapped_ahead, prefetched
from memmesh.crdt.row_keys import KeyRange, LiveKeys, as_point
from memmesh.crdt.storage import MemoryStorage, Storage
from memmesh.crdt.yjs import Row, encode_rows
from memmesh.node.storage import SqliteStorage
from tests.dbkit import craft, key, new_db, next_clock, write

ADMIN = key(1)


def shown(db: Database, store: str = "memory") -> list[tuple[str, Any, str]]:
    return [(r.key, r.value, r.entry_id) for r in db.rows(store)]


def forget_marks(storage: Storage, db_id: str) -> None:
    for k, _ in storage.items_local(namespace(db_id)):
        storage.delete_local(namespace(db_id), k)


def with_rows(db: Database, keys_values: list[tuple[str, Any]], store: str = "memory") -> str:
    """An entry of ADMIN whose rows carry the given keys (not necessarily their own clocks)."""
    client = client_id_for(ADMIN.public.raw)
    clock = next_clock(db, ADMIN, store)
    update = encode_rows(client, clock, store, keys_values)
    entry = craft(db, ADMIN, {store: (update, clock, len(keys_values))})
    result = db.ingest([(entry.header, dict(entry.payloads))])
    assert result.accepted == [entry.id], result.rejected
    return entry.id


def test_payloads_are_marked_as_they_are_stored_and_open_reads_the_same() -> None:
    storage = MemoryStorage()
    db = new_db(ADMIN, storage)
    ids = [write(db, ADMIN, {"n": i}) for i in range(3)]
    db.set_meta(ADMIN, display_name="renamed")
    marks = read_marks(storage, db.id)
    assert {i: marks.get(i) for i in ids} == {i: frozenset({"memory"}) for i in ids}
    assert marks[db.id] == {"meta"}  # not its settings: open needs their operations, always decoded
    before = (shown(db), db.meta(), db.settings())
    assert (shown(reopened := Database.open(storage, db.id)), reopened.meta(), reopened.settings()) == before
    forget_marks(storage, db.id)
    assert (shown(full := Database.open(storage, db.id)), full.meta(), full.settings()) == before
    # The full check of an unmarked entry (an older release's) marks it for the next open.
    assert read_marks(storage, db.id) == marks


def test_rows_repeating_keys_are_hidden_alike_with_and_without_marks() -> None:
    storage = MemoryStorage()
    db = new_db(ADMIN, storage)
    c = client_id_for(ADMIN.public.raw)
    write(db, ADMIN, "a")  # clock 0, key c/0: a range
    with_rows(db, [(f"{c}/0", "repeats a shown key")])  # clock 1: hidden
    with_rows(db, [(f"{c}/5", "a key ahead of its clock"), (f"{c}/x", "not a clock")])  # clocks 2-3
    with_rows(db, [(f"{c}/05", "leading zero: another string than c/5")])  # clock 4
    write(db, ADMIN, "clock 5, key c/5: repeats the point above")  # hidden
    write(db, ADMIN, "clock 6")
    with_rows(db, [(f"{c}/x", "repeats a key that is no clock")])  # clock 7: hidden
    expected = [f"{c}/0", f"{c}/5", f"{c}/x", f"{c}/05", f"{c}/6"]
    assert [k for k, _, _ in shown(db)] == expected
    # Only payloads keyed by their own clocks are marked; the others are decoded on every open.
    assert sum(1 for stores in read_marks(storage, db.id).values() if "memory" in stores) == 3
    assert [k for k, _, _ in shown(Database.open(storage, db.id))] == expected
    forget_marks(storage, db.id)
    assert [k for k, _, _ in shown(Database.open(storage, db.id))] == expected
    assert [k for k, _, _ in shown(Database.open(storage, db.id))] == expected  # marked again
    # Shown rows derived anew after verdicts change (DerivedState.invalidate) read marks too.
    db._derived.invalidate()
    assert [k for k, _, _ in shown(db)] == expected
    write(db, ADMIN, "clock 8")
    assert [k for k, _, _ in shown(db)] == [*expected, f"{c}/8"]


def test_a_damaged_marked_payload_is_found_on_open(tmp_path: Path) -> None:
    path = tmp_path / "node.sqlite"
    storage = SqliteStorage(path)
    db = new_db(ADMIN, storage)
    target = write(db, ADMIN, {"value": "x" * 200})
    assert read_marks(storage, db.id)[target] == {"memory"}
    db_id = db.id
    storage.close()
    raw = sqlite3.connect(path)
    [(blob,)] = raw.execute("SELECT data FROM payloads WHERE entry = (SELECT seq FROM entries WHERE id = ?)",
                            (target,)).fetchall()
    damaged = bytearray(blob)
    damaged[60] ^= 0xFF
    raw.execute("UPDATE payloads SET data = ? WHERE entry = (SELECT seq FROM entries WHERE id = ?)",
                (bytes(damaged), target))
    raw.commit()
    raw.close()
    storage = SqliteStorage(path)
    with pytest.raises(DamagedError, match="memory.* does not match its sha256"):
        Database.open(storage, db_id)
    storage.close()


def test_marks_of_another_version_or_entry_are_no_marks() -> None:
    storage = MemoryStorage()
    db = new_db(ADMIN, storage)
    first, second = write(db, ADMIN, "one"), write(db, ADMIN, "two")
    mark = encode_mark(first, {"memory"})
    assert decode_mark(first, mark) == {"memory"}
    assert decode_mark(second, mark) is None  # moved to another entry
    other_version = mark.replace(f"{CHECKS_VERSION}:".encode(), f"{CHECKS_VERSION + 1}:".encode(), 1)
    assert decode_mark(first, other_version) is None
    assert decode_mark(first, mark[:-1] + bytes([mark[-1] ^ 1])) is None
    assert decode_mark(first, b"") is None
    storage.put_local_many(namespace(db.id), [(second, mark), (first, other_version)])
    assert first not in read_marks(storage, db.id) and second not in read_marks(storage, db.id)
    assert shown(Database.open(storage, db.id)) == shown(db)
    marks = read_marks(storage, db.id)
    assert (marks[first], marks[second]) == ({"memory"}, {"memory"})


def test_a_read_only_storage_opens_without_marking(tmp_path: Path) -> None:
    path = tmp_path / "node.sqlite"
    storage = SqliteStorage(path)
    db = new_db(ADMIN, storage)
    write(db, ADMIN, "one")
    forget_marks(storage, db.id)
    expected = shown(db)
    storage.close()
    snapshot = SqliteStorage.open_snapshot(path)
    try:
        assert shown(Database.open(snapshot, db.id)) == expected
        assert read_marks(snapshot, db.id) == {}
    finally:
        snapshot.close()


# ----------------------------------------------------------------------------- row keys

clients = st.sampled_from([7, 70])
suffixes = st.one_of(st.integers(0, 30).map(str), st.sampled_from(["00", "01", "x", "", "3/1", "٣", "+1"]))


@st.composite
def payloads(draw: st.DrawFn) -> tuple[int, KeyRange | tuple[Row, ...]]:
    client = draw(clients)
    if draw(st.booleans()):
        return client, KeyRange(client, draw(st.integers(0, 30)), draw(st.integers(1, 6)))
    keys = draw(st.lists(suffixes, min_size=1, max_size=4, unique=True))
    return client, tuple(Row(f"{client}/{s}", None, 0) for s in keys)


def key_strings(rows: KeyRange | tuple[Row, ...]) -> list[str]:
    if isinstance(rows, KeyRange):
        return [f"{rows.client}/{n}" for n in range(rows.clock, rows.clock + rows.length)]
    return [r.key for r in rows]


@settings(max_examples=150, deadline=None)
@given(st.lists(payloads(), max_size=25))
def test_live_keys_compare_exactly_as_key_strings(sequence: list[tuple[int, KeyRange | tuple[Row, ...]]]) -> None:
    live, model = LiveKeys(), set()
    for client, rows in sequence:
        keys = key_strings(rows)
        new = not any(k in model for k in keys)
        assert live.add_if_new(rows, client) == new
        if new:
            model.update(keys)


def test_as_point_reads_only_canonical_decimals() -> None:
    assert as_point(7, "7/0") == 0 and as_point(7, "7/12") == 12
    assert [as_point(7, k) for k in ("7/", "7/01", "7/x", "70/1", "7/٣", "7/+1", "7/1/2")] == [None] * 7


# ----------------------------------------------------------------------------- prefetch

def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "memmesh-prefetch"]


def test_prefetched_yields_in_order_and_raises_where_the_source_did() -> None:
    assert list(prefetched(range(1000), depth=3)) == list(range(1000))

    def failing() -> Iterator[int]:
        yield from range(5)
        raise DamagedError("page 2 unreadable")

    seen: list[int] = []
    with pytest.raises(DamagedError, match="page 2 unreadable"):
        for item in prefetched(failing(), depth=2):
            seen.append(item)
    assert seen == [0, 1, 2, 3, 4]
    assert not prefetch_threads()


def test_a_reader_that_stops_early_stops_the_worker() -> None:
    def endless() -> Iterator[int]:
        n = 0
        while True:
            yield n
            n += 1

    it = prefetched(endless(), depth=4)
    assert [next(it) for _ in range(10)] == list(range(10))
    it.close()
    assert not prefetch_threads()


def ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("memmesh-ahead")]


def test_mapped_ahead_yields_in_order_raises_at_its_item_and_stops_its_threads() -> None:
    for chunk in (1, 3, 64):
        assert list(mapped_ahead(lambda x: x * x, range(500), workers=3, depth=7, chunk=chunk)) == [
            x * x for x in range(500)]

    def square_unless_13(x: int) -> int:
        if x == 13:
            raise ValueError("thirteen")
        return x * x

    seen: list[int] = []
    with pytest.raises(ValueError, match="thirteen"):
        for y in mapped_ahead(square_unless_13, range(100), depth=4, chunk=5):  # 13 mid-chunk
            seen.append(y)
    assert seen == [x * x for x in range(13)]
    assert not ahead_threads()

    def endless() -> Iterator[int]:
        n = 0
        while True:
            yield n
            n += 1

    it = mapped_ahead(str, prefetched(endless(), depth=4), depth=5)  # as opening reads the log
    assert [next(it) for _ in range(10)] == [str(n) for n in range(10)]
    it.close()
    assert not ahead_threads() and not prefetch_threads()


@pytest.mark.parametrize("few", [0, 10**9])  # every store read entry by entry / every one by a scan
def test_rows_of_a_store_few_entries_hold_are_the_same_either_way(monkeypatch, few: int) -> None:
    from memmesh.crdt import derived

    db = new_db(ADMIN)
    ids = [write(db, ADMIN, {"n": i}) for i in range(20)] + [write(db, ADMIN, {"q": i}, "quarantine") for i in range(2)]
    db.erase(ADMIN, ids[3], "memory")
    expected = {s: [(r.key, r.value, r.entry_id, r.order) for r in db.rows(s)] for s in ("memory", "quarantine", "none")}
    monkeypatch.setattr(derived, "_FEW_ENTRIES", few)
    assert {s: [(r.key, r.value, r.entry_id, r.order) for r in db.rows(s)] for s in expected} == expected
    assert len(expected["memory"]) == 19 and len(expected["quarantine"]) == 2 and expected["none"] == []
