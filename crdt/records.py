"""Records and small pieces shared by the database's modules: rows, ingest results and events,
the store-name rule, the stateless payload check, the GC pause.
"""
from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from memmesh.auth.keys import SigningKey
from memmesh.auth.ops import GrantOp, RevokeOp, parse_op
from memmesh.auth.permissions import Permission
from memmesh.crdt.entry import Entry, StoreDescriptor
from memmesh.crdt.erasure import ERASE, EraseOp, parse_erase
from memmesh.crdt.errors import EntryRejected
from memmesh.crdt.frozen import builder
from memmesh.crdt.storage import StoredEntry
from memmesh.crdt.yjs import Row, check_append, decode_append_update, encode_gc

log = logging.getLogger(__name__)

SETTINGS = "_settings"
META = "meta"
_NO_PAYLOADS: Mapping[str, bytes | None] = MappingProxyType({})
STORE_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_:./-")
# What is kept of an author's entries that are not valid (candidates that a later event could
# make valid, and equivocation evidence after a fork): enough to decide and to prove, never an
# unbounded tail. Entries another stored or pending entry names as a parent are always kept,
# so that the bound never cuts an honest writer's entry off from its past.
MAX_UNACCEPTED_ENTRIES = 1024  # see docs/security.md: an offline writer revoked meanwhile
MAX_UNACCEPTED_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RowRecord:
    """One row of a store, as an accepted entry inserted it."""

    store: str
    key: str
    value: Any
    entry_id: str
    author: str
    ts: int
    order: tuple[int, str, int]  # (height, entry id, clock): T order, the deterministic "newest"


@dataclass
class IngestResult:
    accepted: list[str] = field(default_factory=list)  # stored and applied
    stored_rejected: list[str] = field(default_factory=list)  # kept as candidates, not applied
    rejected: list[tuple[str | None, str, str]] = field(default_factory=list)  # (id, reason, detail)
    pending: list[str] = field(default_factory=list)  # waiting for parents or payloads
    filled: list[tuple[str, str]] = field(default_factory=list)  # (entry id, store) payloads filled in
    duplicates: int = 0

    def merge(self, other: IngestResult) -> None:
        self.accepted += other.accepted
        self.stored_rejected += other.stored_rejected
        self.rejected += other.rejected
        self.pending += other.pending
        self.filled += other.filled
        self.duplicates += other.duplicates


@dataclass(frozen=True, slots=True)
class Refused:
    """One refusal as observers see it (Database.on_outcome): RefusalLog's record plus the author."""

    id: str  # entry id, or the digest of header bytes that did not parse
    author: str | None  # None when the bytes did not parse far enough to name one
    reason: str
    detail: str
    source: str  # who sent it: "peer:<key>", "local", "" when unknown


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one ingest did, for observers: entries stored and accepted by it, and what it refused
    (a refusal may name another source than ``source``: pending entries it evicted)."""

    source: str
    accepted: tuple[tuple[str, str], ...] = ()  # (entry id, author)
    refused: tuple[Refused, ...] = ()


@dataclass(frozen=True, slots=True)
class RowsAdded:
    store: str
    rows: tuple[RowRecord, ...]


@dataclass(frozen=True, slots=True)
class Rebuilt:
    """Verdicts of already-applied entries changed: derived state was rebuilt from the log."""


_gc_lock = threading.Lock()
_gc_depth = 0
_gc_state: list[bool] = []  # was the collector enabled when the outermost pause began


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a batch is processed.

    A batch allocates many small, long-lived objects (entries, version vectors, rows), and the
    collector would otherwise rescan everything alive each time a generation fills up: about a
    fifth of the cost of accepting an entry. Batches are bounded, so the pause is too; nested
    and concurrent batches share one pause.
    """
    global _gc_depth
    with _gc_lock:
        _gc_depth += 1
        if _gc_depth == 1:
            was_enabled = gc.isenabled()
            gc.disable()
            _gc_state.append(was_enabled)
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0 and _gc_state.pop():
                gc.enable()


def valid_store_name(name: str) -> bool:
    return bool(name) and len(name) <= 128 and STORE_NAME_CHARS.issuperset(name)


@dataclass(frozen=True, slots=True)
class _Shape:
    """What the stateless checks of one payload found."""

    rows: tuple[Row, ...]
    ops: tuple[GrantOp | RevokeOp, ...]
    erases: tuple[EraseOp, ...]


_shape = builder(_Shape)


def check_payload_shape(store: str, desc: StoreDescriptor, update: bytes) -> _Shape:
    """Every check of one payload that needs nothing but the payload and its descriptor.

    Raises RejectedError with the reason code; the same verdict on every replica, whatever
    else it holds (row keys are author-prefixed, so a row can only ever collide with a row of
    its own author; see DerivedState.visible for how such a collision is shown).
    """
    if not valid_store_name(store):
        raise EntryRejected("entry.store_name", f"invalid store name {store!r}")
    return checked_name_shape(store, desc, update)


def checked_name_shape(store: str, desc: StoreDescriptor, update: bytes) -> _Shape:
    """check_payload_shape of a store whose name the caller has checked already."""
    decoded = decode_append_update(update, root=store, client=desc.client)
    if decoded.clock != desc.clock or decoded.length != desc.clock_len:
        raise EntryRejected("entry.payload", f"store {store!r} update does not cover the clock range its descriptor claims")
    if len(decoded.rows) > 1:
        # One row starting at the descriptor's clock (checked above) passes check_append as is.
        check_append(decoded, next_clock=desc.clock, exists=_never)
    ops: tuple[GrantOp | RevokeOp, ...] = ()
    erases: tuple[EraseOp, ...] = ()
    if store == SETTINGS:
        ops = tuple(parse_op(row.value) for row in decoded.rows)
    elif store == ERASE:
        erases = tuple(parse_erase(row.value, valid_store=valid_store_name) for row in decoded.rows)
    return _shape(decoded.rows, ops, erases)


def _never(_key: str) -> bool:
    return False


def _client(key: SigningKey) -> int:
    from memmesh.crdt.entry import client_id_for

    return client_id_for(key.public.raw)


def doc_update(desc: StoreDescriptor, update: bytes | None, accepted: bool) -> bytes:
    """What a store's document is given for an entry: its payload when its rows are shown,
    otherwise a GC struct over its clocks (the author's later entries still integrate)."""
    if accepted and update is not None:
        return update
    return encode_gc(desc.client, desc.clock, desc.clock_len)


def _stored(entry: Entry) -> StoredEntry:
    return StoredEntry(entry.id, entry.header, dict(entry.payloads))


_build_entry = builder(Entry)  # the index strips every entry it takes of its payloads


def _with_payloads(entry: Entry, payloads: Mapping[str, bytes | None]) -> Entry:
    return _build_entry(entry.id, entry.header, entry.author, entry.seq, entry.prev, entry.parents,
                 entry.ts, entry.db, entry.nonce, entry.stores, payloads)


def _op_value(op: GrantOp | RevokeOp | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(op, Mapping):
        return dict(op)
    if isinstance(op, RevokeOp):
        return {"op": "revoke", "key": op.key}
    value: dict[str, Any] = {"op": "grant", "key": op.key, "perm": op.perm}
    if op.priority is not None:
        value["priority"] = op.priority
    return value


def _perm_text(perm: Permission | None) -> str:
    if perm is None:
        return "no permission"
    return perm.level if perm.priority is None else f"{perm.level}({perm.priority})"
