"""The storage conformance suite: every adapter of crdt.storage.Storage must pass it.

Use it by subclassing ``StorageConformance`` in a test module (the class name must start
with ``Test`` there) and implementing ``open_storage`` and, for durable adapters, ``reopen``::

    class TestMyStorage(StorageConformance):
        def open_storage(self, location, **limits):
            return MyStorage(location / "store", **limits)

``location`` is an empty per-test directory; ``limits`` are ``max_pending`` /
``max_pending_bytes`` when a test needs them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import threading
from pathlib import Path

import pytest

from memmesh.crdt.errors import StorageError
from memmesh.crdt.storage import Aside, DamagedRecord, PendingRecord, Storage, StoredEntry

_counter = itertools.count()


def make_entry(size: int = 40, stores: tuple[str, ...] = ("memory",), tag: str = "") -> StoredEntry:
    """A self-consistent entry: id = sha256 of the header; payload bytes derived from the id."""
    n = next(_counter)
    header = f"hdr:{n}:{tag}:".encode() + bytes(range(256))[: size % 256]
    entry_id = "sha256:" + hashlib.sha256(header).hexdigest()
    payloads = {s: hashlib.sha256(f"{entry_id}/{s}".encode()).digest() * (1 + size // 32) for s in stores}
    return StoredEntry(entry_id, header, payloads)


class StorageConformance:
    """Behaviour every Storage adapter shares. Subclasses provide open_storage/reopen."""

    def open_storage(self, location: Path, **limits: int) -> Storage:  # pragma: no cover
        raise NotImplementedError

    def reopen(self, storage: Storage, location: Path, **limits: int) -> Storage:
        """Close and reopen the same durable state. Non-durable adapters return ``storage``."""
        return storage

    # ----------------------------------------------------------------- fixtures

    @pytest.fixture
    def location(self, tmp_path: Path) -> Path:
        return tmp_path

    @pytest.fixture
    def store(self, location: Path):
        s = self.open_storage(location)
        s.add_database("db-a")
        yield s
        s.close()

    # ----------------------------------------------------------------- databases

    def test_add_database_idempotent_and_ordered(self, location):
        s = self.open_storage(location)
        for name in ["z", "a", "m", "a", "z"]:
            s.add_database(name)
        assert s.databases() == ["z", "a", "m"]
        s = self.reopen(s, location)
        assert s.databases() == ["z", "a", "m"]
        assert s.has_database("m") and not s.has_database("b") and not s.has_database("")
        s.close()

    def test_unknown_database_raises(self, store):
        e = make_entry()
        for call in [
            lambda: store.append("nope", [e]),
            lambda: store.entries("nope"),
            lambda: store.get("nope", e.id),
            lambda: store.get_many("nope", [e.id]),
            lambda: store.has("nope", e.id),
            lambda: store.count("nope"),
            lambda: store.erase_payload("nope", e.id, "memory"),
            lambda: store.fill_payload("nope", e.id, "memory", b"x"),
            lambda: store.put_pending("nope", e, ["sha256:x"]),
            lambda: store.pending("nope"),
            lambda: store.get_pending("nope", e.id),
            lambda: store.drop_pending("nope", [e.id]),
        ]:
            with pytest.raises(StorageError, match="unknown database"):
                call()

    def test_databases_are_separate(self, store):
        store.add_database("db-b")
        a, b = make_entry(), make_entry()
        store.append("db-a", [a])
        store.append("db-b", [b, a])
        assert [e.id for e in store.entries("db-a")] == [a.id]
        assert [e.id for e in store.entries("db-b")] == [b.id, a.id]
        assert not store.has("db-a", b.id) and store.has("db-b", b.id)
        store.erase_payload("db-b", a.id, "memory")
        assert store.get("db-a", a.id).payloads["memory"] == a.payloads["memory"]

    # ----------------------------------------------------------------- append

    def test_append_get_has_count(self, store):
        entries = [make_entry(size=i * 7, stores=("memory", "embeddings:x/y")[: 1 + i % 2]) for i in range(10)]
        assert store.count("db-a") == 0
        assert store.append("db-a", entries) == 10
        assert store.count("db-a") == 10
        for e in entries:
            assert store.has("db-a", e.id)
            got = store.get("db-a", e.id)
            assert got == e
            assert type(got.header) is bytes
            assert all(type(v) is bytes for v in got.payloads.values())
        assert store.get("db-a", "sha256:unknown") is None
        assert not store.has("db-a", "sha256:unknown")

    def test_get_many_is_get_of_each_in_order(self, store):
        entries = [make_entry(size=i * 3, stores=("memory", "embeddings:x/y")[: 1 + i % 2]) for i in range(1200)]
        store.append("db-a", entries)
        store.add_database("db-b")
        store.append("db-b", [other := make_entry(size=5)])
        store.erase_payload("db-a", entries[7].id, "memory")
        # Out of order, repeated, unknown, another database's, across more than one read slice.
        ids = [e.id for e in reversed(entries)] + [entries[3].id, "sha256:unknown", other.id, entries[7].id]
        got = store.get_many("db-a", ids)
        assert got == [store.get("db-a", i) for i in ids]
        assert got[-3:-1] == [None, None] and got[-1].payloads["memory"] is None
        assert store.get_many("db-a", []) == []
        with pytest.raises((TypeError, ValueError)):
            store.get_many("db-a", "sha256:abc")  # a bare str is not a sequence of ids
        with pytest.raises(StorageError, match="unknown database"):
            store.get_many("nope", ids[:1])

    def test_append_order_preserved(self, store):
        entries = [make_entry(size=i) for i in range(1200)]  # more than one read page
        store.append("db-a", entries[:3])
        store.append("db-a", entries[3:700])
        store.append("db-a", entries[700:])
        assert [e.id for e in store.entries("db-a")] == [e.id for e in entries]
        assert list(store.entries("db-a")) == entries

    def test_entries_reading_only_some_stores(self, store):
        entries = [make_entry(size=i, stores=("memory", "embeddings:x/y", "meta")[: 1 + i % 3]) for i in range(700)]
        store.append("db-a", entries)
        store.erase_payload("db-a", entries[2].id, "embeddings:x/y")
        only = list(store.entries("db-a", stores=["embeddings:x/y"]))
        assert [e.id for e in only] == [e.id for e in entries]  # every entry, in order
        for got, full in zip(only, store.entries("db-a")):
            assert got.header == full.header
            assert dict(got.payloads) == {k: v for k, v in full.payloads.items() if k == "embeddings:x/y"}
        assert only[2].payloads == {"embeddings:x/y": None}
        assert all(not e.payloads for e in store.entries("db-a", stores=[]))
        with pytest.raises(TypeError):
            list(store.entries("db-a", stores="memory"))

    def test_order_is_first_stored_not_id_order(self, store):
        entries = sorted((make_entry() for _ in range(20)), key=lambda e: e.id, reverse=True)
        store.append("db-a", entries)
        assert [e.id for e in store.entries("db-a")] == [e.id for e in entries]

    def test_append_idempotent(self, store):
        a, b, c = make_entry(), make_entry(), make_entry()
        assert store.append("db-a", [a, b]) == 2
        assert store.append("db-a", [a, b]) == 0
        assert store.append("db-a", [b, c, a]) == 1
        assert [e.id for e in store.entries("db-a")] == [a.id, b.id, c.id]
        assert store.count("db-a") == 3

    def test_duplicate_within_batch_first_copy_wins(self, store):
        a = make_entry()
        other = StoredEntry(a.id, a.header, {"memory": b"different"})
        assert store.append("db-a", [a, other, a]) == 1
        assert store.get("db-a", a.id) == a

    def test_reappend_does_not_resurrect_erased_payload(self, store):
        a = make_entry()
        store.append("db-a", [a])
        store.erase_payload("db-a", a.id, "memory")
        assert store.append("db-a", [a]) == 0
        assert store.get("db-a", a.id).payloads == {"memory": None}

    def test_empty_append(self, store):
        assert store.append("db-a", []) == 0
        assert store.count("db-a") == 0

    def test_append_accepts_any_iterable_and_bytes_like(self, store):
        a = make_entry()
        loose = StoredEntry(a.id, bytearray(a.header), {"memory": memoryview(a.payloads["memory"])})
        assert store.append("db-a", (e for e in [loose])) == 1
        assert store.get("db-a", a.id) == a

    def test_empty_and_none_payloads(self, store):
        e = StoredEntry("sha256:e", b"", {"a": b"", "b": None})
        f = StoredEntry("sha256:f", b"h", {})
        store.append("db-a", [e, f])
        assert store.get("db-a", e.id) == e
        assert store.get("db-a", e.id).payloads["a"] == b""
        assert store.get("db-a", e.id).payloads["b"] is None
        assert store.get("db-a", f.id) == f

    def test_payloads_returned_read_only_and_sorted(self, store):
        payloads = {"z": b"1", "a": b"2", "m": b"3"}
        e = StoredEntry("sha256:p", b"h", payloads)
        store.append("db-a", [e])
        payloads["z"] = b"changed by caller"  # the storage must not alias caller data
        got = store.get("db-a", e.id)
        assert list(got.payloads) == ["a", "m", "z"]
        assert got.payloads["z"] == b"1"
        with pytest.raises(TypeError):
            got.payloads["a"] = b"x"  # type: ignore[index]

    @pytest.mark.parametrize(
        "bad, exc",
        [
            (lambda e: StoredEntry(e.id, e.header, {5: b"x"}), TypeError),  # store name not a str
            (lambda e: StoredEntry(e.id, e.header, {"": b"x"}), ValueError),
            (lambda e: StoredEntry(e.id, e.header, {"s": "text"}), TypeError),
            (lambda e: StoredEntry(e.id, "text", {}), TypeError),
            (lambda e: StoredEntry(42, e.header, {}), TypeError),
            (lambda e: StoredEntry("", e.header, {}), ValueError),
            (lambda e: StoredEntry("a\x00b", e.header, {}), ValueError),
            (lambda e: StoredEntry("\ud800", e.header, {}), ValueError),
            (lambda e: StoredEntry(e.id, e.header, [("memory", b"x")]), TypeError),
            (lambda e: ("not", "an", "entry"), TypeError),
        ],
    )
    def test_append_atomic(self, store, bad, exc):
        store.add_database("db-b")
        before = make_entry()
        store.append("db-a", [before])
        good = [make_entry(size=300) for _ in range(5)]
        store.put_pending("db-a", make_entry(tag="p"), ["sha256:parent"])
        pending_before = store.pending("db-a")
        batch = [*good[:3], bad(make_entry()), *good[3:]]
        with pytest.raises(exc):
            store.append("db-a", batch, drop_pending=[pending_before[0].id])
        # nothing of the batch is there, nothing else changed, and the storage still works
        assert [e.id for e in store.entries("db-a")] == [before.id]
        assert store.count("db-a") == 1
        assert not any(store.has("db-a", e.id) for e in good)
        assert store.pending("db-a") == pending_before
        assert store.get_pending("db-a", pending_before[0].id) is not None
        assert store.append("db-a", good) == 5
        assert store.count("db-a") == 6

    def test_append_atomic_when_iterable_fails(self, store):
        good = [make_entry() for _ in range(4)]

        def batch():
            yield from good[:2]
            raise RuntimeError("producer failed")

        with pytest.raises(RuntimeError):
            store.append("db-a", batch())
        assert store.count("db-a") == 0
        assert store.append("db-a", good) == 4

    def test_bad_arguments(self, store):
        e = make_entry()
        with pytest.raises(TypeError):
            store.add_database(7)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            store.add_database("")
        with pytest.raises(TypeError):
            store.append("db-a", [e], drop_pending="sha256:abc")  # a bare str is refused
        with pytest.raises(TypeError):
            store.put_pending("db-a", e, "sha256:abc")
        with pytest.raises(TypeError):
            store.drop_pending("db-a", "sha256:abc")
        with pytest.raises(TypeError):
            store.get("db-a", None)  # type: ignore[arg-type]
        assert store.count("db-a") == 0 and store.pending("db-a") == []

    # ----------------------------------------------------------------- erase

    def test_erase_keeps_header(self, store):
        a = make_entry(stores=("memory", "embeddings:p/m"))
        b = make_entry()
        store.append("db-a", [a, b])
        store.erase_payload("db-a", a.id, "memory")
        got = store.get("db-a", a.id)
        assert got.id == a.id and got.header == a.header
        assert got.payloads == {"memory": None, "embeddings:p/m": a.payloads["embeddings:p/m"]}
        assert [e.id for e in store.entries("db-a")] == [a.id, b.id]  # order unchanged
        assert list(store.entries("db-a"))[0] == got
        assert store.get("db-a", b.id) == b
        store.erase_payload("db-a", a.id, "memory")  # idempotent
        assert store.get("db-a", a.id) == got

    def test_erase_unknown_raises(self, store):
        a = make_entry()
        store.append("db-a", [a])
        with pytest.raises(StorageError, match="unknown entry"):
            store.erase_payload("db-a", "sha256:nope", "memory")
        with pytest.raises(StorageError, match="no payload"):
            store.erase_payload("db-a", a.id, "config")
        assert store.get("db-a", a.id) == a

    # ----------------------------------------------------------------- fill

    def test_fill_payload_fills_only_a_missing_payload(self, store):
        a = StoredEntry("sha256:a", b"ha", {"memory": None, "meta": b"kept", "embeddings:p/m": b"vec"})
        b = make_entry(stores=("memory", "meta"))
        store.append("db-a", [a, b])
        store.erase_payload("db-a", a.id, "embeddings:p/m")
        # never received -> filled; bytes-like data is stored as bytes
        store.fill_payload("db-a", a.id, "memory", bytearray(b"arrived"))
        got = store.get("db-a", a.id)
        assert got.payloads == {"embeddings:p/m": None, "memory": b"arrived", "meta": b"kept"}
        assert type(got.payloads["memory"]) is bytes and got.header == a.header
        # erased -> filled
        store.fill_payload("db-a", a.id, "embeddings:p/m", memoryview(b"vec"))
        assert store.get("db-a", a.id).payloads["embeddings:p/m"] == b"vec"
        # present -> unchanged, including a payload that was just filled
        store.fill_payload("db-a", a.id, "meta", b"other")
        store.fill_payload("db-a", a.id, "memory", b"second copy")
        store.fill_payload("db-a", b.id, "memory", b"other")
        assert store.get("db-a", a.id).payloads == {"embeddings:p/m": b"vec", "memory": b"arrived", "meta": b"kept"}
        assert store.get("db-a", b.id) == b
        # the log's order and the store-filtered read see the filled payload
        assert [e.id for e in store.entries("db-a")] == [a.id, b.id]
        assert next(store.entries("db-a", stores=["memory"])).payloads == {"memory": b"arrived"}

    def test_fill_payload_empty_bytes_count_as_present(self, store):
        a = StoredEntry("sha256:a", b"ha", {"memory": None, "meta": b""})
        store.append("db-a", [a])
        store.fill_payload("db-a", a.id, "meta", b"x")  # b"" is present, not missing
        store.fill_payload("db-a", a.id, "memory", b"")
        store.fill_payload("db-a", a.id, "memory", b"late")
        assert store.get("db-a", a.id).payloads == {"memory": b"", "meta": b""}

    def test_fill_payload_unknown_raises(self, store):
        a = StoredEntry("sha256:a", b"ha", {"memory": None})
        p = StoredEntry("sha256:p", b"hp", {"memory": None})
        store.append("db-a", [a])
        store.put_pending("db-a", p, ["sha256:parent"])
        with pytest.raises(StorageError, match="unknown entry"):
            store.fill_payload("db-a", "sha256:nope", "memory", b"x")
        with pytest.raises(StorageError, match="unknown entry"):  # pending is not the log
            store.fill_payload("db-a", p.id, "memory", b"x")
        with pytest.raises(StorageError, match="no payload"):  # a store the entry does not touch
            store.fill_payload("db-a", a.id, "config", b"x")
        store.add_database("db-b")
        with pytest.raises(StorageError, match="unknown entry"):  # entries are per database
            store.fill_payload("db-b", a.id, "memory", b"x")
        assert store.get("db-a", a.id) == a
        assert store.get_pending("db-a", p.id) == p
        assert store.count("db-a") == 1

    @pytest.mark.parametrize(
        "args, exc",
        [
            (("sha256:a", "memory", None), TypeError),  # filling is not erasing
            (("sha256:a", "memory", "text"), TypeError),
            (("sha256:a", "memory", 5), TypeError),
            (("sha256:a", 5, b"x"), TypeError),
            (("sha256:a", "", b"x"), ValueError),
            ((None, "memory", b"x"), TypeError),
            (("", "memory", b"x"), ValueError),
            (("sha256:\x00", "memory", b"x"), ValueError),
        ],
    )
    def test_fill_payload_bad_arguments_change_nothing(self, store, args, exc):
        a = StoredEntry("sha256:a", b"ha", {"memory": None})
        store.append("db-a", [a])
        with pytest.raises(exc):
            store.fill_payload("db-a", *args)
        assert store.get("db-a", a.id) == a

    def test_fill_payload_survives_reopen(self, location):
        s = self.open_storage(location)
        s.add_database("d")
        a = make_entry(stores=("memory", "meta"))
        b = StoredEntry("sha256:b", b"hb", {"memory": None})
        s.append("d", [a, b])
        s.erase_payload("d", a.id, "memory")
        s.fill_payload("d", a.id, "memory", a.payloads["memory"])
        s.fill_payload("d", b.id, "memory", b"arrived")
        s = self.reopen(s, location)
        assert s.get("d", a.id) == a
        assert s.get("d", b.id).payloads == {"memory": b"arrived"}
        s.fill_payload("d", b.id, "memory", b"again")  # still present after the reopen
        assert list(s.entries("d")) == [a, StoredEntry(b.id, b.header, {"memory": b"arrived"})]
        s.close()

    # ----------------------------------------------------------------- pending

    def test_pending_roundtrip(self, store):
        a, b = make_entry(), make_entry(stores=("memory", "meta"))
        store.put_pending("db-a", a, ["sha256:p1", "sha256:p2"], author="key:alice", source="peer:bob",
                          received_ms=1_700_000_000_123)
        store.put_pending("db-a", b, ("sha256:p1",))  # the defaults
        assert store.pending("db-a") == [
            PendingRecord(a.id, "key:alice", "peer:bob", 1_700_000_000_123, a.size, ("sha256:p1", "sha256:p2")),
            PendingRecord(b.id, "", "", 0, b.size, ("sha256:p1",)),
        ]
        assert all(type(r) is PendingRecord for r in store.pending("db-a"))
        assert store.get_pending("db-a", a.id) == a and store.get_pending("db-a", b.id) == b
        assert store.count("db-a") == 0  # pending is not in the log
        assert not store.has("db-a", a.id) and store.get("db-a", a.id) is None

    def test_pending_record_fields_exact(self, store):
        # Sizes and labels that a lossy adapter would get wrong: empty payload, erased
        # payload (not counted), non-ASCII labels, the largest time.
        e = StoredEntry("sha256:e", b"h" * 7, {"a": b"", "b": None, "c": b"x" * 5})
        store.put_pending("db-a", e, [], author="é\U0001f600", source="peer:\uffff", received_ms=2**63 - 1)
        [record] = store.pending("db-a")
        assert record == PendingRecord("sha256:e", "é\U0001f600", "peer:\uffff", 2**63 - 1, 12, ())
        assert type(record.missing) is tuple and type(record.received_ms) is int

    def test_pending_replace_keeps_position(self, store):
        a, b, c = make_entry(), make_entry(), make_entry()
        store.put_pending("db-a", a, ["sha256:p1"], author="k1", source="peer:x", received_ms=10)
        store.put_pending("db-a", b, ["sha256:p2"], author="k2", source="local", received_ms=20)
        store.put_pending("db-a", c, ["sha256:p4"])
        # a new copy of a (other payloads, so another size) with every field changed
        a2 = StoredEntry(a.id, a.header, {"memory": b"short", "meta": None})
        store.put_pending("db-a", a2, ["sha256:p3", "sha256:p5"], author="k9", source="peer:y", received_ms=30)
        assert store.pending("db-a") == [
            PendingRecord(a.id, "k9", "peer:y", 30, a2.size, ("sha256:p3", "sha256:p5")),
            PendingRecord(b.id, "k2", "local", 20, b.size, ("sha256:p2",)),
            PendingRecord(c.id, "", "", 0, c.size, ("sha256:p4",)),
        ]
        assert a2.size != a.size
        assert store.get_pending("db-a", a.id) == a2
        # replacing with the defaults resets the labels too (no field is kept from before)
        store.put_pending("db-a", b, [])
        assert store.pending("db-a")[1] == PendingRecord(b.id, "", "", 0, b.size, ())

    def test_pending_returns_no_bytes(self, store):
        entries = [make_entry(size=200, stores=("memory", "meta")) for _ in range(3)]
        for e in entries:
            store.put_pending("db-a", e, ["sha256:p"], author="k", source="peer:k", received_ms=5)
        records = store.pending("db-a")
        assert [r.id for r in records] == [e.id for e in entries]
        for record, e in zip(records, entries):
            assert type(record) is PendingRecord
            values = dataclasses.astuple(record)
            assert not any(isinstance(v, (bytes, bytearray, memoryview)) for v in values)
            assert not hasattr(record, "header") and not hasattr(record, "payloads")
            assert e.header.hex() not in repr(record) and repr(e.header) not in repr(record)

    def test_get_pending(self, store):
        a = make_entry(stores=("memory", "embeddings:p/m"))
        b = StoredEntry("sha256:b", bytes(range(256)) + b"\x00", {"z": b"", "a": None, "m": b"\x00\xff"})
        store.put_pending("db-a", a, ["sha256:p"])
        store.put_pending("db-a", b, [])
        got = store.get_pending("db-a", b.id)
        assert got == b
        assert type(got.header) is bytes and got.header == b.header
        assert list(got.payloads) == ["a", "m", "z"] and got.payloads["a"] is None
        assert all(type(v) is bytes for v in got.payloads.values() if v is not None)
        with pytest.raises(TypeError):
            got.payloads["a"] = b"x"  # type: ignore[index]
        assert store.get_pending("db-a", a.id) == a
        assert store.get_pending("db-a", "sha256:unknown") is None
        store.append("db-a", [make_entry()])
        logged = next(store.entries("db-a"))
        assert store.get_pending("db-a", logged.id) is None  # the log is not the pending area
        store.drop_pending("db-a", [b.id])
        assert store.get_pending("db-a", b.id) is None
        store.append("db-a", [a], drop_pending=[a.id])
        assert store.get_pending("db-a", a.id) is None and store.get("db-a", a.id) == a
        assert store.pending("db-a") == []
        with pytest.raises(TypeError):
            store.get_pending("db-a", None)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            store.get_pending("db-a", "")

    def test_pending_with_no_missing_parents(self, store):
        # An entry that waits for payloads only.
        a = make_entry()
        store.put_pending("db-a", a, [], source="local", received_ms=7)
        store.put_pending("db-a", make_entry(), ())
        assert store.pending("db-a")[0] == PendingRecord(a.id, "", "local", 7, a.size, ())
        assert store.pending("db-a")[1].missing == ()
        assert store.get_pending("db-a", a.id) == a

    def test_pending_per_database(self, store):
        store.add_database("db-b")
        a = make_entry()
        store.put_pending("db-a", a, ["sha256:p"], author="k")
        assert store.pending("db-b") == []
        assert store.get_pending("db-b", a.id) is None
        store.put_pending("db-b", a, [])
        assert store.pending("db-b") == [PendingRecord(a.id, "", "", 0, a.size, ())]
        assert store.pending("db-a") == [PendingRecord(a.id, "k", "", 0, a.size, ("sha256:p",))]

    def test_drop_pending(self, store):
        a, b, c = make_entry(), make_entry(), make_entry()
        for e in (a, b, c):
            store.put_pending("db-a", e, ["sha256:p"])
        store.drop_pending("db-a", [b.id, "sha256:never-pending"])
        assert [r.id for r in store.pending("db-a")] == [a.id, c.id]
        store.drop_pending("db-a", [])
        store.drop_pending("db-a", [a.id, c.id])
        assert store.pending("db-a") == []

    def test_append_with_drop_pending_is_one_step(self, store):
        a, b = make_entry(), make_entry()
        store.put_pending("db-a", a, ["sha256:p"])
        store.put_pending("db-a", b, ["sha256:p"])
        assert store.append("db-a", [a], drop_pending=[a.id]) == 1
        assert [r.id for r in store.pending("db-a")] == [b.id]
        assert store.get("db-a", a.id) == a
        assert store.append("db-a", [], drop_pending=[b.id]) == 0
        assert store.pending("db-a") == []

    @pytest.mark.parametrize(
        "kwargs, exc",
        [
            ({"author": 5}, TypeError),
            ({"author": b"key"}, TypeError),
            ({"author": None}, TypeError),
            ({"author": "a\x00b"}, ValueError),
            ({"author": "\ud800"}, ValueError),
            ({"source": 1.0}, TypeError),
            ({"source": "peer:\x00"}, ValueError),
            ({"received_ms": -1}, ValueError),
            ({"received_ms": 2**63}, ValueError),
            ({"received_ms": 1.5}, TypeError),
            ({"received_ms": True}, TypeError),
            ({"received_ms": "5"}, TypeError),
            ({"received_ms": None}, TypeError),
            ({"missing": "sha256:abc"}, TypeError),  # a bare str
            ({"missing": ["sha256:a", ""]}, ValueError),
            ({"missing": ["sha256:a", 7]}, TypeError),
            ({"entry": "not an entry"}, TypeError),
        ],
    )
    def test_put_pending_bad_arguments_change_nothing(self, store, kwargs, exc):
        a, b = make_entry(), make_entry()
        store.put_pending("db-a", a, ["sha256:p"], author="k", source="local", received_ms=3)
        before = store.pending("db-a")
        call = {"entry": a, "missing": ["sha256:q"], "author": "k2", "source": "peer:x", "received_ms": 9, **kwargs}
        for target in (a, b):  # replacing an existing pending entry, and adding a new one
            args = {**call, "entry": kwargs.get("entry", target)}
            with pytest.raises(exc):
                store.put_pending("db-a", args.pop("entry"), args.pop("missing"), **args)
        assert store.pending("db-a") == before
        assert store.get_pending("db-a", a.id) == a and store.get_pending("db-a", b.id) is None

    def test_put_pending_labels_are_keyword_only(self, store):
        with pytest.raises(TypeError):
            store.put_pending("db-a", make_entry(), [], "key:alice")  # type: ignore[misc]
        assert store.pending("db-a") == []

    def test_pending_bound_entries(self, location):
        s = self.open_storage(location, max_pending=3)
        s.add_database("d")
        s.add_database("other")
        entries = [make_entry() for _ in range(4)]
        for e in entries[:3]:
            s.put_pending("d", e, ["sha256:p"])
        with pytest.raises(StorageError, match="pending area full") as info:
            s.put_pending("d", entries[3], ["sha256:p"])
        assert "3 entries" in str(info.value)
        assert [r.id for r in s.pending("d")] == [e.id for e in entries[:3]]
        s.put_pending("d", entries[0], ["sha256:q"])  # replacing does not grow the count
        s.put_pending("other", entries[3], [])  # the bound is per database
        s.drop_pending("d", [entries[1].id])
        s.put_pending("d", entries[3], ["sha256:p"])
        assert len(s.pending("d")) == 3
        s = self.reopen(s, location, max_pending=3)  # the bound holds across a reopen
        with pytest.raises(StorageError, match="pending area full"):
            s.put_pending("d", make_entry(), [])
        s.close()

    def test_pending_bound_bytes(self, location):
        s = self.open_storage(location, max_pending_bytes=1000)
        s.add_database("d")
        big = StoredEntry("sha256:big", b"h" * 100, {"memory": b"x" * 500, "meta": None})  # 600 bytes
        small = StoredEntry("sha256:small", b"h" * 100, {"memory": b"x" * 300})  # 400 bytes
        assert big.size == 600 and small.size == 400
        s.put_pending("d", big, ["sha256:p"])
        s.put_pending("d", small, ["sha256:p"])  # exactly 1000: allowed
        with pytest.raises(StorageError, match="pending area full") as info:
            s.put_pending("d", StoredEntry("sha256:one", b"h", {}), [])
        assert "1001 bytes" in str(info.value)
        # growing an existing pending entry counts only the difference
        with pytest.raises(StorageError, match="pending area full"):
            s.put_pending("d", StoredEntry("sha256:small", b"h" * 101, {"memory": b"x" * 300}), [], author="k")
        assert s.pending("d")[1] == PendingRecord("sha256:small", "", "", 0, 400, ("sha256:p",))  # unchanged
        s.put_pending("d", StoredEntry("sha256:small", b"h" * 50, {"memory": b"x" * 300}), [])
        s.put_pending("d", StoredEntry("sha256:one", b"h" * 50, {}), [])  # 600+350+50 = 1000
        assert [r.id for r in s.pending("d")] == ["sha256:big", "sha256:small", "sha256:one"]
        with pytest.raises(StorageError, match="pending area full"):
            s.put_pending("d", StoredEntry("sha256:huge", b"h" * 2000, {}), [])
        s.close()

    # ----------------------------------------------------------------- local records

    def test_local_kv(self, store):
        assert store.get_local("creds", "k") is None
        assert store.items_local("creds") == []
        store.put_local("creds", "k", b"v1")
        store.put_local("creds", "a", bytearray(b"v2"))
        store.put_local("creds", "K", b"")
        store.put_local("other", "k", b"elsewhere")
        assert store.get_local("creds", "k") == b"v1"
        assert store.get_local("creds", "K") == b""
        store.put_local("creds", "k", b"v3")  # overwrite
        assert store.items_local("creds") == [("K", b""), ("a", b"v2"), ("k", b"v3")]
        assert store.items_local("other") == [("k", b"elsewhere")]
        assert store.delete_local("creds", "k") is True
        assert store.delete_local("creds", "k") is False
        assert store.delete_local("nowhere", "k") is False
        assert store.get_local("creds", "k") is None
        assert store.items_local("creds") == [("K", b""), ("a", b"v2")]
        with pytest.raises(TypeError):
            store.put_local("creds", "k", "text")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            store.put_local("", "k", b"v")

    def test_local_sorted_by_code_point(self, store):
        keys = ["b", "a", "é", "Z", "\U0001f600", "\uffff", "a0", "aa", "~"]
        for k in keys:
            store.put_local("ns", k, k.encode())
        assert [k for k, _ in store.items_local("ns")] == sorted(keys)

    def test_put_local_many(self, store):
        store.put_local("ns", "old", b"before")
        store.put_local("ns", "kept", b"k")
        store.put_local_many("ns", [("a", b"1"), ("old", bytearray(b"after")), ("é", memoryview(b"3"))])
        assert store.items_local("ns") == [("a", b"1"), ("kept", b"k"), ("old", b"after"), ("é", b"3")]
        assert all(type(v) is bytes for _, v in store.items_local("ns"))
        store.put_local_many("ns", (pair for pair in [("dup", b"first"), ("dup", b"last")]))  # last wins
        assert store.get_local("ns", "dup") == b"last"
        store.put_local_many("other", {"x": b"from a dict"}.items())
        assert store.items_local("other") == [("x", b"from a dict")]
        before = store.items_local("ns")
        store.put_local_many("ns", [])
        store.put_local_many("empty", [])
        assert store.items_local("ns") == before and store.items_local("empty") == []

    @pytest.mark.parametrize(
        "bad, exc",
        [
            (("k", "text"), TypeError),
            (("k", None), TypeError),
            ((5, b"v"), TypeError),
            (("", b"v"), ValueError),
            (("a\x00", b"v"), ValueError),
            (("\ud800", b"v"), ValueError),
            (("k", b"v", b"extra"), TypeError),
            (("k",), TypeError),
            (["k", b"v"], TypeError),  # pairs are tuples
            ("kv", TypeError),
        ],
    )
    def test_put_local_many_atomic(self, store, bad, exc):
        store.put_local("ns", "a", b"before")
        batch = [("a", b"changed"), ("b", b"new"), bad, ("c", b"new")]
        with pytest.raises(exc):
            store.put_local_many("ns", batch)
        assert store.items_local("ns") == [("a", b"before")]
        store.put_local_many("ns", batch[:2])  # still works
        assert store.items_local("ns") == [("a", b"changed"), ("b", b"new")]

    def test_put_local_many_atomic_when_iterable_fails(self, store):
        def batch():
            yield ("a", b"1")
            yield ("b", b"2")
            raise RuntimeError("producer failed")

        with pytest.raises(RuntimeError):
            store.put_local_many("ns", batch())
        assert store.items_local("ns") == []

    @pytest.mark.parametrize(
        "ns, items, exc",
        [
            ("", [("k", b"v")], ValueError),
            (5, [("k", b"v")], TypeError),
            ("ns", "kv", TypeError),  # a bare str
            ("ns", b"kv", TypeError),
            ("ns", {"k": b"v"}, TypeError),  # a mapping: pass .items()
            ("ns", None, TypeError),
            ("ns", 5, TypeError),
        ],
    )
    def test_put_local_many_bad_arguments(self, store, ns, items, exc):
        with pytest.raises(exc):
            store.put_local_many(ns, items)
        assert store.items_local("ns") == [] and store.items_local("k") == []

    def test_put_local_many_survives_reopen(self, location):
        s = self.open_storage(location)
        s.put_local_many("ns", [(f"k{i:03}", bytes([i])) for i in range(200)])
        s = self.reopen(s, location)
        assert s.items_local("ns") == [(f"k{i:03}", bytes([i])) for i in range(200)]
        s.close()

    # ----------------------------------------------------------------- the damaged area

    def test_move_aside_from_the_log(self, store):
        log = [make_entry(stores=("memory", "meta")) for _ in range(4)]
        store.append("db-a", log)
        store.erase_payload("db-a", log[1].id, "meta")
        store.move_aside("db-a", [Aside(log[1].id, "entry.id", "its header changed"),
                                  Aside(log[2].id, "entry.orphaned")], moved_ms=77)
        assert [e.id for e in store.entries("db-a")] == [log[0].id, log[3].id]
        assert store.count("db-a") == 2 and not store.has("db-a", log[1].id) and store.get("db-a", log[2].id) is None
        kept = StoredEntry(log[1].id, log[1].header, {"memory": log[1].payloads["memory"], "meta": None})
        assert store.get_damaged("db-a", log[1].id) == kept  # as found, an erased payload still None
        assert store.get_damaged("db-a", log[2].id) == log[2]
        assert store.damaged("db-a") == [
            DamagedRecord(log[1].id, "log", "entry.id", "its header changed", 77, kept.size),
            DamagedRecord(log[2].id, "log", "entry.orphaned", "", 77, log[2].size),
        ]
        assert store.get_damaged("db-a", log[0].id) is None
        # never seen as stored: the same entry can be stored again (fetched from a peer)
        assert store.append("db-a", [log[1]]) == 1 and store.get("db-a", log[1].id) == log[1]
        assert [r.id for r in store.damaged("db-a")] == [log[1].id, log[2].id]

    def test_move_aside_some_payloads_keeps_the_entry(self, store):
        e = make_entry(stores=("memory", "meta"))
        store.append("db-a", [e])
        store.move_aside("db-a", [Aside(e.id, "entry.payload", "meta fails its digest", stores=("meta", "extra"))])
        assert store.get("db-a", e.id) == StoredEntry(e.id, e.header, {"extra": None, "memory": e.payloads["memory"],
                                                                        "meta": None})
        assert store.get_damaged("db-a", e.id) == e
        [record] = store.damaged("db-a")
        assert record.stores == ("extra", "meta") and record.origin == "log" and record.size == e.size
        store.fill_payload("db-a", e.id, "meta", b"again")  # not received: sync fills it again
        store.fill_payload("db-a", e.id, "extra", b"x")
        assert store.get("db-a", e.id).payloads == {"extra": b"x", "memory": e.payloads["memory"], "meta": b"again"}

    def test_move_aside_from_pending_frees_the_bound(self, location):
        s = self.open_storage(location, max_pending=2)
        s.add_database("d")
        waiting = [make_entry(), make_entry()]
        for e in waiting:
            s.put_pending("d", e, ["sha256:p"], author="k", source="peer:x", received_ms=5)
        s.move_aside("d", [Aside(waiting[0].id, "entry.signature", origin="pending")], moved_ms=9)
        assert [r.id for r in s.pending("d")] == [waiting[1].id] and s.get_pending("d", waiting[0].id) is None
        assert s.get_damaged("d", waiting[0].id) == waiting[0]
        assert s.damaged("d") == [DamagedRecord(waiting[0].id, "pending", "entry.signature", "", 9, waiting[0].size)]
        s.put_pending("d", make_entry(), [])  # room again
        with pytest.raises(StorageError, match="pending area full"):
            s.put_pending("d", make_entry(), [])
        s.close()

    def test_move_aside_is_atomic(self, store):
        log = [make_entry() for _ in range(3)]
        store.append("db-a", log)
        store.put_pending("db-a", make_entry(), [])
        before = (list(store.entries("db-a")), store.pending("db-a"))
        for moves in ([Aside(log[0].id, "x"), Aside("sha256:nope", "x")],
                      [Aside(log[0].id, "x"), Aside(log[1].id, "x", origin="pending")]):
            with pytest.raises(StorageError, match="cannot move aside"):
                store.move_aside("db-a", moves)
            assert (list(store.entries("db-a")), store.pending("db-a")) == before and store.damaged("db-a") == []

    @pytest.mark.parametrize("moves, exc", [
        ("sha256:x", TypeError),
        ([("sha256:x", "r")], TypeError),
        ([Aside("", "r")], ValueError),
        ([Aside("sha256:x", "")], ValueError),
        ([Aside("sha256:x", "r", origin="elsewhere")], ValueError),
        ([Aside("sha256:x", "r", origin="pending", stores=("memory",))], ValueError),
        ([Aside("sha256:x", "r", stores="memory")], TypeError),
        ([Aside("sha256:x", "r", detail=5)], TypeError),
    ])
    def test_move_aside_bad_arguments_change_nothing(self, store, moves, exc):
        e = make_entry()
        store.append("db-a", [e])
        with pytest.raises(exc):
            store.move_aside("db-a", moves)
        with pytest.raises(ValueError, match="named twice"):
            store.move_aside("db-a", [Aside(e.id, "r"), Aside(e.id, "s")])
        with pytest.raises(ValueError):
            store.move_aside("db-a", [Aside(e.id, "r")], moved_ms=-1)
        assert list(store.entries("db-a")) == [e] and store.damaged("db-a") == []

    def test_move_aside_twice_replaces_in_place_and_drop(self, store):
        a, b = make_entry(stores=("memory", "meta")), make_entry()
        store.append("db-a", [a, b])
        store.move_aside("db-a", [Aside(a.id, "entry.payload", stores=("meta",))], moved_ms=1)
        store.move_aside("db-a", [Aside(b.id, "entry.id")], moved_ms=2)
        store.move_aside("db-a", [Aside(a.id, "entry.orphaned", "later")], moved_ms=3)
        damaged_a = StoredEntry(a.id, a.header, {"memory": a.payloads["memory"], "meta": None})
        assert store.damaged("db-a") == [DamagedRecord(a.id, "log", "entry.orphaned", "later", 3, damaged_a.size),
                                         DamagedRecord(b.id, "log", "entry.id", "", 2, b.size)]
        assert store.get_damaged("db-a", a.id) == damaged_a  # the copy as found the second time
        assert store.count("db-a") == 0
        store.drop_damaged("db-a", [a.id, "sha256:unknown"])
        store.drop_damaged("db-a", [])
        assert [r.id for r in store.damaged("db-a")] == [b.id] and store.get_damaged("db-a", a.id) is None
        with pytest.raises(TypeError):
            store.drop_damaged("db-a", b.id)
        for call in (lambda: store.move_aside("nope", []), lambda: store.damaged("nope"),
                     lambda: store.get_damaged("nope", b.id), lambda: store.drop_damaged("nope", [b.id])):
            with pytest.raises(StorageError, match="unknown database"):
                call()

    def test_damaged_area_per_database_and_survives_reopen(self, location):
        s = self.open_storage(location)
        s.add_database("d1")
        s.add_database("d2")
        e1, e2 = make_entry(), make_entry()
        s.append("d1", [e1])
        s.append("d2", [e2])
        s.move_aside("d1", [Aside(e1.id, "entry.signature", "bad")], moved_ms=5)
        s = self.reopen(s, location)
        assert s.damaged("d2") == [] and s.get_damaged("d2", e1.id) is None
        assert s.damaged("d1") == [DamagedRecord(e1.id, "log", "entry.signature", "bad", 5, e1.size)]
        assert s.get_damaged("d1", e1.id) == e1 and list(s.entries("d1")) == []
        s.close()
        with pytest.raises(StorageError, match="closed"):
            s.damaged("d1")

    # ----------------------------------------------------------------- lifecycle

    def test_reopen_gives_identical_state(self, location):
        s = self.open_storage(location, max_pending=50)
        s.add_database("d1")
        s.add_database("d2")
        log = [make_entry(size=i * 13, stores=("memory", "meta")[: 1 + i % 2]) for i in range(30)]
        s.append("d1", log[:20])
        s.append("d2", log[10:])
        s.erase_payload("d1", log[3].id, "memory")
        s.put_pending("d1", make_entry(), ["sha256:a", "sha256:b"], author="k", source="peer:p", received_ms=99)
        s.put_pending("d1", make_entry(stores=("memory", "meta")), [], source="local", received_ms=2**63 - 1)
        s.put_pending("d2", make_entry(), [])
        s.put_local("ns", "k", b"v")
        s.put_local_many("ns2", [("k", b"w"), ("l", b"")])

        def snapshot(st: Storage):
            return (
                st.databases(),
                {
                    d: (
                        list(st.entries(d)),
                        st.count(d),
                        st.pending(d),
                        [st.get_pending(d, r.id) for r in st.pending(d)],
                    )
                    for d in st.databases()
                },
                st.items_local("ns"),
                st.items_local("ns2"),
            )

        expected = snapshot(s)
        assert [r.author for r in expected[1]["d1"][2]] == ["k", ""]
        assert all(expected[1]["d1"][3])
        s = self.reopen(s, location, max_pending=50)
        assert snapshot(s) == expected
        assert s.append("d1", log) == 10  # still appendable, dedup still works
        s.close()

    def test_closed_storage_raises(self, location):
        s = self.open_storage(location)
        s.add_database("d")
        s.close()
        s.close()  # idempotent
        for call in [
            lambda: s.add_database("e"),
            lambda: s.databases(),
            lambda: s.append("d", []),
            lambda: s.count("d"),
            lambda: s.get_local("n", "k"),
            lambda: s.put_local("n", "k", b""),
            lambda: s.put_local_many("n", [("k", b"")]),
            lambda: s.fill_payload("d", "sha256:x", "memory", b""),
            lambda: s.put_pending("d", make_entry(), []),
            lambda: s.pending("d"),
            lambda: s.get_pending("d", "sha256:x"),
        ]:
            with pytest.raises(StorageError, match="closed"):
                call()

    def test_context_manager_closes(self, location):
        with self.open_storage(location) as s:
            s.add_database("d")
        with pytest.raises(StorageError, match="closed"):
            s.databases()

    def test_iteration_sees_a_consistent_prefix_while_appending(self, store):
        first = [make_entry() for _ in range(600)]
        store.append("db-a", first)
        it = store.entries("db-a")
        head = [next(it) for _ in range(10)]
        later = [make_entry() for _ in range(5)]
        store.append("db-a", later)
        seen = head + list(it)
        assert [e.id for e in seen] == [e.id for e in first + later]

    def test_concurrent_writers_from_threads(self, store):
        batches = [[make_entry(tag=f"t{t}") for _ in range(50)] for t in range(8)]
        errors: list[BaseException] = []

        def work(batch):
            try:
                for i in range(0, len(batch), 5):
                    store.append("db-a", batch[i : i + 5])
                    store.put_local("threads", batch[i].id, b"x")
                    store.count("db-a")
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(b,)) for b in batches]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert store.count("db-a") == 400
        assert len(store.items_local("threads")) == 80
        ids = [e.id for e in store.entries("db-a")]
        for b in batches:  # each thread's entries keep their relative order
            positions = [ids.index(e.id) for e in b]
            assert positions == sorted(positions)
