"""Verify one database's stored entries again, and compare its derived state with storage.

Sans-transport: everything goes through the ``Storage`` interface, so it runs on a read-only
snapshot (check) or on the storage a repair then changes.

Per entry of the log and of the pending area (``verify``):

* the id: the header bytes must still hash to the id they are stored under;
* the header: format, canonical form, database, and the signature, every batch on every core
  (``crdt.entry.decode_many``; its reason codes name what is wrong);
* each payload against the sha256 and length the signed header gives. A payload that fails
  while the header is intact is *payload damage*: the entry can stay, that payload becomes "not
  received" and is fetched again. A payload row for a store the header does not describe, or a
  described store with no row at all, makes the whole entry damaged (it cannot be loaded);
* its parents and feed predecessor: an intact entry whose ancestors are not all intact and
  stored is *orphaned* (it cannot be applied without them).

Then the derived state (``rebuild``): the database is opened on a view of storage that shows
only the sound entries, damaged payloads as not received, and that records instead of doing
any write. Opening rebuilds the verdicts and erasure from the log; a payload an accepted
erase covers that storage still holds is found as the erase the view was asked to perform.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from memmesh.auth.keys import public_key_str
from memmesh.crdt.database import Database
from memmesh.crdt.entry import Entry, decode_entry, decode_many, id_of
from memmesh.crdt.errors import EntryRejected, MemmeshError, StorageError
from memmesh.crdt.storage import Aside, DamagedRecord, PendingRecord, Storage, StoredEntry, check_name, freeze_payloads
from memmesh.node.integrity.report import Problem

BATCH = 2048  # entries per decode_many call (and per progress event)

Progress = Callable[[int, int], None]


@dataclass
class Verified:
    """What ``verify`` found in one database."""

    db_id: str
    entries: int = 0
    pending: int = 0
    signatures: int = 0
    damaged: dict[str, Problem] = field(default_factory=dict)  # whole entries of the log
    payloads: dict[str, tuple[tuple[str, ...], Problem]] = field(default_factory=dict)  # id -> (stores, why)
    orphans: dict[str, Problem] = field(default_factory=dict)
    absent: dict[str, Problem] = field(default_factory=dict)  # parents named but not stored at all
    pending_damaged: dict[str, Problem] = field(default_factory=dict)
    aside: list[DamagedRecord] = field(default_factory=list)

    def problems(self) -> list[Problem]:
        return [*self.damaged.values(), *(p for _, p in self.payloads.values()), *self.absent.values(),
                *self.orphans.values(), *self.pending_damaged.values()]

    def moves(self) -> list[Aside]:
        """What a repair moves aside, in storage order (so orphans keep their causal order)."""
        out = [Aside(i, p.code, p.detail) for i, p in self.damaged.items()]
        out += [Aside(i, "entry.orphaned", p.detail) for i, p in self.orphans.items()]
        # An orphan whose payload is damaged too moves whole (its copy keeps the bytes as found).
        out += [Aside(i, p.code, p.detail, stores=stores) for i, (stores, p) in self.payloads.items()
                if i not in self.orphans]
        out += [Aside(i, p.code, p.detail, origin="pending") for i, p in self.pending_damaged.items()]
        return out

    @property
    def hidden(self) -> set[str]:
        return set(self.damaged) | set(self.orphans)


def header_fields(header: bytes) -> tuple[str | None, int | None]:
    """The author and seq of a header, as far as its bytes can still be read (for reports)."""
    try:
        entry = decode_entry(header, None, verify_signature=False)
        return entry.author_key, entry.seq
    except Exception:  # damaged bytes: read what is left, leniently
        pass
    try:
        body = msgpack.unpackb(bytes(header)[1:-66], raw=False, strict_map_key=False)
        author, seq = body.get("author"), body.get("seq")
        return (public_key_str(author) if isinstance(author, bytes) and len(author) == 32 else None,
                seq if type(seq) is int else None)
    except Exception:
        return None, None


def _problem(code: str, detail: str, stored: StoredEntry, entry: Entry | None = None, **kw: Any) -> Problem:
    author: str | None
    seq: int | None
    if entry is not None:
        author, seq = entry.author_key, entry.seq
    else:
        author, seq = header_fields(stored.header)
    return Problem(code, detail, entry=stored.id, author=author, seq=seq, **kw)


def _check_one(stored: StoredEntry, decoded: Entry | EntryRejected) -> tuple[Entry | None, Problem | None,
                                                                              tuple[str, ...]]:
    """(entry if the header is intact, whole-entry damage, stores whose payload is damaged)."""
    # The id first, as crdt.stored_check does: changed header bytes are damage whatever they
    # now happen to decode to; an intact id with a failing decode is a consistent forgery.
    if id_of(stored.header) != stored.id:
        return None, _problem("entry.id", "its header bytes no longer hash to the id it is stored under",
                              stored), ()
    if isinstance(decoded, EntryRejected):
        return None, _problem(decoded.reason, str(decoded), stored), ()
    extra = sorted(set(stored.payloads) - set(decoded.stores))
    if extra:
        return None, _problem("entry.payload", f"a payload row for store {extra[0]!r}, which its header does "
                                               "not describe", stored, decoded), ()
    bad = []
    for store, desc in decoded.stores.items():
        if store not in stored.payloads:
            bad.append(store)  # no row at all: made a "not received" row by the repair
            continue
        data = stored.payloads[store]
        if data is not None and (len(data) != desc.length or hashlib.sha256(data).digest() != desc.sha256):
            bad.append(store)
    return decoded, None, tuple(sorted(bad))


def _batches(items: Iterable[StoredEntry], size: int = BATCH) -> Iterator[list[StoredEntry]]:
    batch: list[StoredEntry] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def verify(storage: Storage, db_id: str, progress: Progress | None = None) -> Verified:
    """Check every entry of ``db_id`` in ``storage`` again (see the module docstring)."""
    out = Verified(db_id)
    total = storage.count(db_id)
    records: list[PendingRecord] = storage.pending(db_id)
    total += len(records)
    done = 0
    # Storage order is causal order: an entry is sound when it is intact and every parent was
    # stored, sound, before it (what Database.open requires too; a parent stored after its
    # child is damage to the order, and the repair's re-apply puts the child after it).
    sound: set[str] = set()
    unresolved: dict[str, set[str]] = {}  # intact entry -> parents not sound before it
    order: dict[str, int] = {}  # storage position: moves keep causal order
    fields_of: dict[str, tuple[str, int]] = {}  # author and seq of unresolved entries, for reports
    # An intact entry's signed prev names its author's previous entry: that entry's author and
    # seq, known for sure even when its own header is damaged.
    successor: dict[str, tuple[str, int]] = {}

    for batch in _batches(storage.entries(db_id)):
        decoded = decode_many([(s.header, None) for s in batch], expected_db=db_id)
        out.signatures += sum(isinstance(d, Entry) or d.reason == "entry.signature" for d in decoded)
        for stored, item in zip(batch, decoded):
            order[stored.id] = len(order)
            entry, damage, bad = _check_one(stored, item)
            if damage is not None:
                out.damaged[stored.id] = damage
                continue
            assert entry is not None
            if bad:
                out.payloads[stored.id] = (bad, _problem(
                    "entry.payload", f"the {', '.join(bad)} payload{'s no longer match' if len(bad) > 1 else ' no longer matches'} "
                    "the signed digest (the header is intact)", stored, entry, store=bad[0]))
            parents = set(entry.parents)
            if entry.prev is not None:
                parents.add(entry.prev)
                successor[entry.prev] = (entry.author_key, entry.seq - 1)
            need = {p for p in parents if p not in sound}
            if need:
                unresolved[entry.id] = need
                fields_of[entry.id] = (entry.author_key, entry.seq)
            else:
                sound.add(entry.id)
        done += len(batch)
        out.entries += len(batch)
        if progress is not None:
            progress(done, total)
    _orphans(out, unresolved, fields_of, order)
    for entry_id, problem in [*out.damaged.items(), *out.absent.items()]:
        if entry_id in successor:
            problem.author, problem.seq = successor[entry_id]
    # The pending area: the same checks, but its entries wait for parents by design.
    for batch in _batches(s for s in (storage.get_pending(db_id, r.id) for r in records) if s is not None):
        decoded = decode_many([(s.header, None) for s in batch], expected_db=db_id)
        out.signatures += sum(isinstance(d, Entry) or d.reason == "entry.signature" for d in decoded)
        for stored, item in zip(batch, decoded):
            entry, damage, bad = _check_one(stored, item)
            if damage is None and bad:
                damage = _problem("pending.damaged", f"its {', '.join(bad)} payload no longer matches the signed "
                                                     "digest", stored, entry)
            if damage is not None:
                out.pending_damaged[stored.id] = Problem("pending.damaged", f"{damage.code}: {damage.detail}",
                                                         entry=stored.id, author=damage.author, seq=damage.seq)
        done += len(batch)
        out.pending += len(batch)
        if progress is not None:
            progress(done, total)
    out.aside = storage.damaged(db_id)
    return out


def _orphans(out: Verified, unresolved: dict[str, set[str]], fields_of: dict[str, tuple[str, int]],
             order: dict[str, int]) -> None:
    """Name, for each entry that never resolved, the damaged or absent entry it descends from."""
    cause: dict[str, str] = {}

    def root_of(entry_id: str) -> str:
        path = []
        current = entry_id
        while current in unresolved and current not in cause:
            path.append(current)
            # A damaged or absent parent first: any blocking parent leads to a root cause.
            need = unresolved[current]
            current = min(need, key=lambda p: (p in unresolved or (p in order and p not in out.damaged), p))
        found = cause.get(current, current)
        for p in path:
            cause[p] = found
        return found

    named: dict[str, int] = {}  # absent parent -> how many entries name it
    for need in unresolved.values():
        for p in need:
            if p not in order:
                named[p] = named.get(p, 0) + 1
    for parent, n in named.items():
        out.absent[parent] = Problem("entry.parent_missing", f"named as a parent by {n} stored "
                                     f"entr{'y' if n == 1 else 'ies'} but not stored", entry=parent)
    for entry_id in sorted(unresolved, key=order.__getitem__):
        root = root_of(entry_id)
        if root in out.damaged:
            why = "damaged"
        elif root in order:
            why = "stored after what descends from it (the log's order is damaged)"
        else:
            why = "not stored"
        author, seq = fields_of[entry_id]
        out.orphans[entry_id] = Problem("entry.orphaned", f"it descends from {root}, which is {why}",
                                        entry=entry_id, author=author, seq=seq)


# ----------------------------------------------------------------------------- derived state


class SoundView(Storage):
    """``base`` as the database would be after moving the damage aside: only sound entries,
    damaged payloads as not received, damaged pending entries gone. Read-only: erases are
    recorded in ``would_erase`` (what storage should have done and did not), any other write
    raises."""

    def __init__(self, base: Storage, found: Verified) -> None:
        self._base = base
        self._db = found.db_id
        self._hidden = found.hidden
        self._nulls = {i: set(stores) for i, (stores, _p) in found.payloads.items()}
        self._hidden_pending = set(found.pending_damaged)
        self.max_pending = base.max_pending
        self.max_pending_bytes = base.max_pending_bytes
        self.would_erase: list[tuple[str, str]] = []
        self.path = getattr(base, "path", None)  # what messages name (Database._where)

    def _shown(self, stored: StoredEntry) -> StoredEntry:
        nulls = self._nulls.get(stored.id)
        if not nulls:
            return stored
        payloads = dict(stored.payloads)
        payloads.update(dict.fromkeys(nulls))
        return StoredEntry(stored.id, stored.header, freeze_payloads(payloads))

    def _refuse(self, *args: object, **kwargs: object) -> Any:
        raise StorageError("memmesh check reads storage through a read-only view; nothing may be written")

    add_database = append = fill_payload = put_pending = drop_pending = _refuse
    put_local = put_local_many = delete_local = move_aside = drop_damaged = _refuse

    def databases(self) -> list[str]:
        return self._base.databases()

    def entries(self, db_id: str, *, stores: Collection[str] | None = None) -> Iterator[StoredEntry]:
        return (self._shown(s) for s in self._base.entries(db_id, stores=stores) if s.id not in self._hidden)

    def get(self, db_id: str, entry_id: str) -> StoredEntry | None:
        stored = None if entry_id in self._hidden else self._base.get(db_id, entry_id)
        return None if stored is None else self._shown(stored)

    def has(self, db_id: str, entry_id: str) -> bool:
        return entry_id not in self._hidden and self._base.has(db_id, entry_id)

    def count(self, db_id: str) -> int:
        return sum(1 for _ in self.entries(db_id, stores=()))

    def erase_payload(self, db_id: str, entry_id: str, store: str) -> None:
        self.would_erase.append((entry_id, store))

    def pending(self, db_id: str) -> list[PendingRecord]:
        return [r for r in self._base.pending(db_id) if r.id not in self._hidden_pending]

    def get_pending(self, db_id: str, entry_id: str) -> StoredEntry | None:
        return None if entry_id in self._hidden_pending else self._base.get_pending(db_id, entry_id)

    def damaged(self, db_id: str) -> list[DamagedRecord]:
        return self._base.damaged(db_id)

    def get_damaged(self, db_id: str, entry_id: str) -> StoredEntry | None:
        return self._base.get_damaged(db_id, entry_id)

    def get_local(self, ns: str, key: str) -> bytes | None:
        return self._base.get_local(ns, key)

    def items_local(self, ns: str) -> list[tuple[str, bytes]]:
        return self._base.items_local(check_name(ns, "namespace"))

    def close(self) -> None:
        """The base storage is the caller's to close."""


@dataclass
class Rebuilt:
    """The derived state rebuilt from the sound entries, and how storage differs from it."""

    db: Database | None
    problems: list[Problem]
    missing_payloads: list[list[str]]
    waiting_for: list[str]


def rebuild(storage: Storage, found: Verified) -> Rebuilt:
    """Open the database on a SoundView of ``storage`` (see the module docstring)."""
    view = SoundView(storage, found)
    try:
        db = Database.open(view, found.db_id)
    except (MemmeshError, ValueError, KeyError) as exc:
        return Rebuilt(None, [Problem("derived.unbuildable", f"{type(exc).__name__}: {exc}")], [], [])
    problems = []
    for entry_id, store in view.would_erase:
        node = db.entry(entry_id)
        problems.append(Problem("erase.not_applied", f"its {store} payload is still stored although an accepted "
                                                     "erase covers it", entry=entry_id, store=store,
                                author=node.author_key if node else None, seq=node.seq if node else None))
    damaged_payloads = {(i, s) for i, (stores, _p) in found.payloads.items() for s in stores}
    wanted = db.wanted()
    missing = [[e, s] for e, s in wanted["payloads"] if (e, s) not in damaged_payloads]
    return Rebuilt(db, problems, missing, list(wanted["parents"]))


def intact_copy(stored: StoredEntry) -> StoredEntry:
    """``stored`` with every payload that fails the header's digest as not received (None)."""
    entry = decode_entry(stored.header, None, verify_signature=False)
    payloads = {}
    for store, data in stored.payloads.items():
        desc = entry.stores.get(store)
        ok = (desc is not None and data is not None and len(data) == desc.length
              and hashlib.sha256(data).digest() == desc.sha256)
        payloads[store] = data if ok else None
    return StoredEntry(stored.id, stored.header, freeze_payloads(payloads))


def sound_order(entries: Sequence[str], parents_of: Callable[[str], Sequence[str]],
                present: Callable[[str], bool]) -> list[str]:
    """The entries (in the given causal order) whose parents are all present or earlier in the
    list: the ones that can be applied now, in an order that applies."""
    ok: list[str] = []
    taken: set[str] = set()
    for entry_id in entries:
        if all(present(p) or p in taken for p in parents_of(entry_id)):
            ok.append(entry_id)
            taken.add(entry_id)
    return ok
