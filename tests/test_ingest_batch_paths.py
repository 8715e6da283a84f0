"""What an ingest does per batch instead of per entry changes nothing a reader can see (issue 23).

A batch of received entries is applied to the store documents in one document transaction,
its rows keyed by their own clocks are shown by their key range, its "checked" marks are
written as one record, and storage's entry check takes what the pipeline hands it without
naming each field. The oracle for each is the path that does not take the shortcut: a
database opened from the same log (documents and shown rows rebuilt, with and without marks),
and the field-by-field check.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pycrdt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memmesh.auth.ops import GrantOp, RevokeOp
from memmesh.auth.permissions import ADMIN as ADMIN_LEVEL
from memmesh.auth.permissions import holds
from memmesh.crdt.database import Database, Rebuilt, RowsAdded
from memmesh.crdt.entry import client_id_for
from memmesh.crdt.log_index import DECODED_ON_OPEN
from memmesh.crdt.open_marks import (
    CHECKS_VERSION,
    decode_batch,
    encode_batch,
    encode_mark,
    namespace,
    read_marks,
    write_marks,
)
from memmesh.crdt.row_keys import canonical
from memmesh.crdt.storage import MemoryStorage, StoredEntry, check_entry, check_entry_fields
from memmesh.crdt.validity import Evaluator, Event, in_past, root_problem
from memmesh.crdt.yjs import decode_append_update, encode_rows
from memmesh.node.storage import SqliteStorage
from tests.dbkit import craft, key, new_db, rows_update, write
from tests.test_validity_properties import COMMON, causal_order, histories

ADMIN, W1, W2 = key(1), key(2), key(3)
Item = tuple[bytes, dict[str, bytes | None]]


def _ingest_one(db: Database, entry: Any) -> None:
    db.ingest([(entry.header, dict(entry.payloads))])


def _history() -> tuple[list[Item], Database]:
    """Writers with single and multi-row entries, rows that repeat a shown key (hidden), rows
    keyed by something else than their clock, and an entry of a revoked writer (stored, not
    applied: its clocks reach the documents as a GC struct)."""
    db = new_db(ADMIN)
    db.change_settings(ADMIN, [GrantOp(str(W1.public), "write", 10), GrantOp(str(W2.public), "write", 10)])
    c1 = client_id_for(W1.public.raw)
    for i in range(12):
        write(db, W1 if i % 3 else W2, {"key": f"k{i}", "value": f"memory {i}"})
    clock = db._next_clock[(str(W1.public), "memory")]
    _ingest_one(db, craft(db, W1, {"memory": rows_update(W1, "memory", clock, ["a", "b", "c"])}))
    clock += 3
    _ingest_one(db, craft(db, W1, {"memory": (encode_rows(c1, clock, "memory", [(f"{c1}/0", "repeats")]), clock, 1)}))
    clock += 1
    _ingest_one(db, craft(db, W1, {"memory": (encode_rows(c1, clock, "memory", [(f"{c1}/x", "no clock")]), clock, 1)}))
    db.change_settings(ADMIN, [RevokeOp(str(W2.public))])
    w2_clock = db._next_clock[(str(W2.public), "memory")]
    revoked = craft(db, W2, {"memory": rows_update(W2, "memory", w2_clock, ["after its revocation"])})
    _ingest_one(db, revoked)
    assert db.verdict(revoked.id) is not None and not db.is_accepted(revoked.id)
    for i in range(12, 20):
        write(db, W1, {"key": f"k{i}", "value": f"memory {i}"})
    return [(s.header, dict(s.payloads)) for s in db.storage.entries(db.id)], db


HISTORY, SOURCE = _history()


def _observed(db: Database) -> dict[str, Any]:
    docs = {s: json.dumps(db.doc(s).get(s, type=pycrdt.Map).to_py(), sort_keys=True, default=repr)
            for s in db.stores()}
    rows = {s: [(r.entry_id, r.key, json.dumps(r.value, sort_keys=True), r.order) for r in db.rows(s)]
            for s in db.stores()}
    return {"accepted": sorted(db.accepted_ids()), "docs": docs, "rows": rows,
            "shown": {s: sorted(db.shown_entries(s)) for s in db.stores()}}


def _forget_marks(storage: Any, db_id: str) -> None:
    for k, _ in storage.items_local(namespace(db_id)):
        storage.delete_local(namespace(db_id), k)


def _split(items: list[Item], cuts: list[int]) -> list[list[Item]]:
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(items)}), len(items)]
    return [items[a:b] for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(1, len(HISTORY) - 1), max_size=5))
def test_batches_applied_at_once_read_as_a_rebuild_does(tmp_path_factory: pytest.TempPathFactory,
                                                         cuts: list[int]) -> None:
    path = tmp_path_factory.mktemp("batches") / "node.sqlite"
    storage = SqliteStorage(path)
    storage.add_database(SOURCE.id)
    db = Database(storage, SOURCE.id)
    db.ingest(HISTORY[:1])
    db.doc("memory")  # a document someone reads is kept up to date batch by batch
    events: list[Any] = []
    db.subscribe(events.append)
    for result in db.ingest_batches(_split(HISTORY[1:], cuts)):
        assert not result.rejected and not result.pending
    live = _observed(db)
    assert live == _observed(SOURCE)
    assert live == _observed(Database.open(storage, SOURCE.id))  # rebuilt, with the marks written
    _forget_marks(storage, SOURCE.id)
    assert live == _observed(Database.open(storage, SOURCE.id))  # rebuilt, every payload decoded
    # Row listeners were told of exactly the rows shown (the hidden ones are not among them),
    # unless verdicts changed and they were told to read everything again.
    if not any(isinstance(ev, Rebuilt) for ev in events):
        added = [(r.entry_id, r.key) for ev in events if isinstance(ev, RowsAdded) and ev.store == "memory"
                 for r in ev.rows]
        assert sorted(added) == sorted((e, k) for e, k, _v, _o in live["rows"]["memory"])
    storage.close()


def test_a_batch_is_marked_by_one_record_naming_its_clock_keyed_payloads(tmp_path: Path) -> None:
    storage = SqliteStorage(tmp_path / "node.sqlite")
    storage.add_database(SOURCE.id)
    db = Database(storage, SOURCE.id)
    db.ingest(HISTORY[:1])  # the root alone: a record of its own
    list(db.ingest_batches([HISTORY[1:]]))
    keys = [k for k, _ in storage.items_local(namespace(SOURCE.id))]
    assert sorted(k.split(":")[0] for k in keys) == ["batch", "sha256"]
    expected = {}
    for stored in storage.entries(SOURCE.id):
        entry = db.entry(stored.id)
        assert entry is not None
        held = set()
        for store, desc in entry.stores.items():
            update = stored.payloads.get(store)
            if store in DECODED_ON_OPEN or update is None:
                continue
            if canonical(decode_append_update(update, root=store, client=desc.client).rows, desc.client, desc.clock):
                held.add(store)
        if held:
            expected[stored.id] = frozenset(held)
    # The repeated key and the key that is no clock are left out (decoded on every open).
    assert len([i for i, n in db._log.nodes.items() if "memory" in n.entry.stores and i not in expected]) == 2
    assert read_marks(storage, SOURCE.id) == expected
    storage.close()


def test_a_batch_record_is_only_taken_whole_of_this_version_and_under_its_own_key() -> None:
    ids = [f"sha256:{i:064x}" for i in range(1, 6)]
    marks = {i: frozenset({"memory"}) for i in ids[:3]} | {ids[3]: frozenset({"meta", "memory"}), ids[4]: frozenset()}
    k, value = encode_batch(marks)
    assert decode_batch(k, value) == marks
    for at in (0, 3, len(value) // 2, len(value) - 1):
        damaged = value[:at] + bytes([value[at] ^ 0x01]) + value[at + 1:]
        assert decode_batch(k, damaged) is None
    assert decode_batch(k, value[:-1]) is None
    other_key, _ = encode_batch({ids[0]: frozenset({"memory"})})
    assert decode_batch(other_key, value) is None  # moved under another key
    other_version = value.replace(f"B{CHECKS_VERSION}:".encode(), f"B{CHECKS_VERSION + 1}:".encode(), 1)
    assert decode_batch(k, other_version) is None
    with pytest.raises(ValueError, match="not an entry id"):
        encode_batch({"sha256:" + "A" * 64: frozenset({"memory"})})


def test_marks_of_one_entry_in_both_forms_add_up_and_a_bad_batch_adds_nothing() -> None:
    storage = MemoryStorage()
    db_id = "sha256:" + "0" * 64
    storage.add_database(db_id)
    a, b, c = (f"sha256:{i:064x}" for i in (7, 8, 9))
    write_marks(storage, db_id, {a: {"memory"}, b: {"memory"}})  # two entries: one batch record
    storage.put_local_many(namespace(db_id), [(a, encode_mark(a, {"meta"}))])
    bad_key, bad_value = encode_batch({c: {"memory"}})
    storage.put_local_many(namespace(db_id), [(bad_key, bad_value[:-2] + b"zz")])
    assert read_marks(storage, db_id) == {a: frozenset({"memory", "meta"}), b: frozenset({"memory"})}
    write_marks(storage, db_id, {c: {"memory"}})  # one entry: a record of its own, as before
    assert read_marks(storage, db_id)[c] == frozenset({"memory"})
    assert (c, encode_mark(c, {"memory"})) in storage.items_local(namespace(db_id))


# ------------------------------------------------------------------- storage's entry check
names = st.one_of(st.text(max_size=8), st.sampled_from(["memory", "_settings", "a\x00b", "é", "\ud800", ""]),
                  st.integers(0, 3), st.binary(max_size=3))
datas = st.one_of(st.none(), st.binary(max_size=4), st.binary(max_size=4).map(bytearray),
                  st.binary(max_size=4).map(memoryview), st.integers(0, 3), st.text(max_size=3))


def _outcome(f: Any, entry: Any) -> Any:
    try:
        got = f(entry)
    except (TypeError, ValueError) as exc:
        return ("raises", type(exc), str(exc))
    return ("ok", got.id, got.header, type(got.payloads), list(got.payloads.items()))


@settings(max_examples=300, deadline=None)
@given(entry_id=names, header=st.one_of(st.binary(max_size=4), st.binary(max_size=4).map(bytearray), st.text(max_size=2)),
       payloads=st.one_of(st.dictionaries(names, datas, max_size=3),
                          st.dictionaries(names, datas, max_size=3).map(MappingProxyType)))
def test_the_entry_check_decides_as_field_by_field(entry_id: Any, header: Any, payloads: Any) -> None:
    entry = StoredEntry(entry_id, header, payloads)
    assert _outcome(check_entry, entry) == _outcome(check_entry_fields, entry)


# ------------------------------------------------------------------ authorisation, remembered
def _never_valid_each_time(ev: Evaluator, event: Event) -> tuple[str, str] | None:
    """Evaluator.never_valid as it reads the operations on the author for every entry anew."""
    if event.is_root:
        problem = root_problem(event)
        return ("auth.bad_root", problem) if problem else None
    refs = [r for r in ev._all_ops.get(event.author, ()) if in_past(r[0], event)]
    if not refs:
        return ("auth.unknown_key", f"no grant to {event.author} in the entry's causal past")
    needed = ADMIN_LEVEL if event.ops else event.needs
    grants = [r[2].permission for r in refs if isinstance(r[2], GrantOp)]
    if not any(holds(p, needed) for p in grants):
        reason = "auth.not_admin" if needed == ADMIN_LEVEL else "auth.not_writer"
        return (reason, f"no grant of {needed} to {event.author} in the entry's causal past")
    best = min(p.priority for p in grants if p.level == ADMIN_LEVEL and p.priority is not None) if event.ops else 0
    for op in event.ops:
        if isinstance(op, GrantOp) and op.priority is not None and op.priority < best:
            return ("auth.grant_exceeds", f"{op}: no grant in the entry's causal past gives "
                                          f"{event.author} an admin priority of {op.priority} or stronger")
    return None


@settings(max_examples=120, **COMMON)
@given(st.one_of(histories(), histories(cascade=True)), st.randoms(use_true_random=False))
def test_never_valid_remembered_per_author_answers_as_read_anew(events: list[Event], rnd: Any) -> None:
    ev = Evaluator()
    for e in causal_order(events, rnd):
        # Asked as the pipeline asks (before add), and again for the same author's next entries.
        assert ev.never_valid(e) == _never_valid_each_time(ev, e)
        ev.add(e)
        for other in rnd.sample(events, min(3, len(events))):
            if other.id not in ev and all(ev._events.get(x.id) is not None for x in events
                                          if x.id != other.id and in_past(x, other)):
                assert ev.never_valid(other) == _never_valid_each_time(ev, other)
