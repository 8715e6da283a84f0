"""Reading a database's stored log back into a fresh ``LogIndex`` on open, and the one line a
damaged or unreadable log is reported with.

Everything in storage passed the whole pipeline before it was written, so signatures are not
checked again (that would be most of the cost of opening a database). Hashes are: an entry's id
is the sha256 of its header, which holds its payloads' digests, so any change to stored bytes
shows, for about one hash per entry (crdt/stored_check.py). Payloads that passed the shape
checks before are not decoded again (crdt/open_marks.py): their bytes still hash to the digest
the header signs, so they are the bytes that passed.
"""
from __future__ import annotations

import functools
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field

from memmesh.crdt.entry import Entry
from memmesh.crdt.errors import DamagedError, StorageError
from memmesh.crdt.log_index import IndexedEntry, LogIndex
from memmesh.crdt.open_marks import read_marks
from memmesh.crdt.prefetch import mapped_ahead, prefetched
from memmesh.crdt.row_keys import ShownKeys
from memmesh.crdt.storage import Storage, StoredEntry
from memmesh.crdt.stored_check import Damage, check_stored

REPAIR = ("run: memmesh check --repair (it fetches damaged entries again from peers), "
          "or restore a backup (memmesh restore)")

# What reading a damaged log can raise: the adapter's errors, and values of the wrong type
# where bytes or text were stored.
UNREADABLE = (StorageError, TypeError, ValueError)

Loaded = list[tuple[IndexedEntry, Mapping[str, ShownKeys]]]


@dataclass
class ReadLog:
    """What reading the log gives: the entries with their rows' keys, in storage order, and
    the checked marks to record for payloads checked in full now."""

    order: Loaded = field(default_factory=list)
    new_marks: dict[str, set[str]] = field(default_factory=dict)


def short(entry_id: str) -> str:
    """An id short enough for one line: ``sha256:`` and 12 hex digits."""
    return entry_id if len(entry_id) <= 19 else entry_id[:19] + "..."


def one_line(text: object) -> str:
    return "".join(c if c.isprintable() else "?" for c in str(text))[:200]


def where(storage: Storage) -> str:
    path = getattr(storage, "path", None)  # SqliteStorage has one; MemoryStorage may not
    return str(path) if path else f"the storage ({type(storage).__name__})"


def unreadable(storage: Storage, db_id: str, exc: BaseException) -> DamagedError:
    if isinstance(exc, DamagedError):
        return exc  # the adapter named the file and what to do
    return DamagedError(f"{where(storage)}: database {short(db_id)} cannot be read ({one_line(exc)}); {REPAIR}")


def _checked(s: StoredEntry, db_id: str) -> Entry | Damage:
    try:
        return check_stored(s, db_id)
    except (TypeError, ValueError) as exc:  # a value of the wrong type where bytes were stored
        return Damage(str(s.id), "entry.format", f"its stored values are unreadable ({exc})")


def read_log(storage: Storage, db_id: str, index: LogIndex) -> ReadLog:
    """Index every stored entry; returns them with their rows' keys, in storage order.

    Raises DamagedError naming the first damaged entry when any is: nothing is applied from a
    damaged database (the index is left partial, and the caller does not use it).
    """
    out = ReadLog()
    marks = read_marks(storage, db_id)
    damaged: list[Damage] = []
    dependent = 0  # intact entries that descend from a damaged one
    seen: set[str] = set()  # intact entries read so far
    lost: set[str] = set()  # entries that cannot be applied: damaged, or descending from one
    stored: Generator[Entry | Damage, None, None] | None = None  # closed on every way out: its threads stop
    try:
        # Reading on one thread, hashing on two (hashlib lets go of the GIL over large
        # payloads): at a million memories, hashing every stored byte is most of an open.
        stored = mapped_ahead(functools.partial(_checked, db_id=db_id), prefetched(storage.entries(db_id)))
        for checked in stored:
            if isinstance(checked, Damage):
                damaged.append(checked)
                lost.add(checked.entry_id)
                continue
            before = (*checked.parents, *((checked.prev,) if checked.prev is not None else ()))
            absent = [p for p in before if p not in seen]
            if absent:
                lost.add(checked.id)
                if any(p in lost for p in absent):
                    dependent += 1
                else:  # stored without its past: rows lost from the file, or an order changed
                    damaged.append(Damage(checked.id, "entry.order",
                                          f"it names {short(absent[0])}, which is not stored before it"))
                continue
            seen.add(checked.id)
            if not damaged:  # nothing is applied from a damaged database: past that, only count
                marked = marks.get(checked.id, frozenset())
                node, rows, fresh = index.index_stored(checked, marked)
                out.order.append((node, rows))
                if fresh:
                    out.new_marks[checked.id] = fresh | marked
    except UNREADABLE as exc:
        raise unreadable(storage, db_id, exc) from exc
    finally:
        if stored is not None:
            stored.close()
    if damaged:
        first = damaged[0]
        n = len(damaged)
        more = f", and {dependent} more that depend on them" if dependent else ""
        raise DamagedError(
            f"{where(storage)} is damaged: database {short(db_id)} has {n} damaged stored "
            f"entr{'y' if n == 1 else 'ies'} (the first, {short(first.entry_id)}: {one_line(first.detail)}){more}; "
            f"{REPAIR}"
        )
    return out
