"""Forgetting a memory for real: every payload that holds it, erased by signed erasures.

A memory key's text lives in every row of that key (the current one and every superseded or
merged version: each repeats the value) and in each such row's vector. ``forget`` erases, with
the signed erase rows of crdt/erasure.py, every payload that carries one of them:

* the ``memory`` payload of each entry holding a row of the key (any version, any author);
* each ``embeddings:*`` payload holding a vector of one of those rows (the vector ``remember``
  wrote in the same entry, or one ``memory reindex`` wrote later in an entry of its own).

An erase removes a whole payload, so what shares one goes with it:

* another key's memory row in a ``memory`` payload being erased (``remember`` writes one row
  per entry, so only a batch written by other software does this) is erased too, and the
  answer lists it under ``erased_with``;
* another memory's vector in an embeddings payload being erased (a reindex batch) is written
  again first, in a new entry signed by the forgetter, so that memory keeps its vector; the
  answer lists it under ``vectors_rewritten``.

Who may: the erase of a payload its signer wrote needs Write, of anyone else's Admin (the rule
crdt/derived.py applies on every replica). So a writer forgets a key whose every payload it
wrote itself; an Admin of the bank forgets any. A forget that would need an erase the signer may
not make is refused whole, naming the other writers, and nothing is written.

The same module gives retention (node/retention.py) the memory rows a run may erase: rows no
longer current (superseded, or retired by ``valid_to``) for longer than the policy's days.

Every replica deletes what an accepted erase covers and checkpoints its write-ahead log
(node/storage.py), and the memory views rebuild on the erase (a ``Rebuilt`` event), so the
text leaves recall, auto-recall, neighbors and status everywhere the erase reaches.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from memmesh.auth.errors import AuthError
from memmesh.auth.keys import SigningKey
from memmesh.auth.permissions import Permission, holds
from memmesh.crdt.database import Database, RowRecord
from memmesh.crdt.erasure import ERASE, EraseOp
from memmesh.node.registry import UnknownName

from .embedding_rows import is_embedding_store
from .rows import MEMORY_STORE
from .view import MemoryView

__all__ = ["ERASES_PER_ENTRY", "ForgetPlan", "ForgetRefused", "Target", "UnknownMemory", "check_authors",
           "check_writer", "erase", "plan_forget", "retired_payloads"]

ERASES_PER_ENTRY = 256  # erase rows per signed entry (as retention)


class ForgetRefused(AuthError):
    """A forget the caller may not make; nothing was written."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, detail)


class UnknownMemory(UnknownName):
    """No row of that key in the bank; nothing was written."""


@dataclass(frozen=True, order=True)
class Target:
    """One payload to erase."""

    entry: str
    store: str
    author: str  # the entry's author (the erase row names it)


@dataclass
class ForgetPlan:
    key: str
    versions: list[RowRecord]  # every row of the key, oldest first (T order)
    targets: list[Target]  # the payloads erased, sorted
    erased_with: list[dict[str, str]] = field(default_factory=list)  # other keys' rows sharing a payload
    rewrite: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)  # (store, value, memory key)


def _memory_key(row: RowRecord) -> str | None:
    v = row.value
    k = v.get("key") if isinstance(v, dict) else None
    return k if isinstance(k, str) else None


def _vector_of(row: RowRecord) -> str | None:
    v = row.value
    r = v.get("row") if isinstance(v, dict) else None
    return r if isinstance(r, str) else None


def _embedding_rows(db: Database) -> dict[str, list[RowRecord]]:
    return {s: db.rows(s) for s in db.stores() if is_embedding_store(s)}


def _by_entry(rows: Iterable[RowRecord]) -> dict[str, list[RowRecord]]:
    out: dict[str, list[RowRecord]] = {}
    for r in rows:
        out.setdefault(r.entry_id, []).append(r)
    return out


def plan_forget(db: Database, key: str, bank: str = "this bank") -> ForgetPlan:
    """What forgetting ``key`` erases in ``db``; UnknownMemory when no row of it is shown."""
    memory_rows = db.rows(MEMORY_STORE)
    versions = [r for r in memory_rows if _memory_key(r) == key]
    if not versions:
        raise UnknownMemory(f"no memory {key!r} in {bank} (no row of that key, current or superseded); "
                            "nothing was erased")
    memory_by_entry = _by_entry(memory_rows)
    key_of_row = {r.key: _memory_key(r) for r in memory_rows}
    targets: set[Target] = set()
    erased_with: dict[tuple[str, str], dict[str, str]] = {}
    for r in versions:
        targets.add(Target(r.entry_id, MEMORY_STORE, r.author))
        for other in memory_by_entry.get(r.entry_id, ()):
            k = _memory_key(other)
            if k != key:
                erased_with[(other.entry_id, other.key)] = {"key": k or "", "entry": other.entry_id}
    # Rows erased with the key's rows lose their vectors too (nothing else would ever use them).
    gone_rows = {r.key for r in versions} | {rk for (_e, rk) in erased_with}
    rewrite: list[tuple[str, dict[str, Any], str]] = []
    for store, rows in _embedding_rows(db).items():
        by_entry = _by_entry(rows)
        for entry_id, in_entry in by_entry.items():
            if not any(_vector_of(r) in gone_rows for r in in_entry):
                continue
            targets.add(Target(entry_id, store, in_entry[0].author))
            for r in in_entry:
                row = _vector_of(r)
                if row is not None and row not in gone_rows and row in key_of_row:
                    rewrite.append((store, dict(r.value), key_of_row[row] or ""))
    present = sorted(t for t in targets if db.payload_state(t.entry, t.store) == "present")
    return ForgetPlan(key, versions, present, sorted(erased_with.values(), key=lambda d: (d["key"], d["entry"])),
                      rewrite)


def check_writer(perm: Permission | None, who: str, bank: str) -> None:
    """ForgetRefused unless ``perm`` holds Write at least (checked before anything is read)."""
    if perm is None or not holds(perm, "write"):
        have = "no permission" if perm is None else f"{perm.level} permission"
        raise ForgetRefused("auth.not_writer", f"{who} may not forget in bank {bank}: its key holds {have}; forgetting needs Write "
                            "(for memories it wrote itself) or Admin; nothing was erased")


def own_vectors_signed_by(plan: ForgetPlan, signer: str, admin_key: SigningKey | None) -> list[Target]:
    """The plan's vector payloads signed with ``admin_key`` (a reindex) when every memory row
    the plan erases is ``signer``'s own: those this node may erase with that key for the
    memories' author. Empty without the key, or when another key wrote a version."""
    if admin_key is None:
        return []
    admin = str(admin_key.public)
    if any(t.author != signer for t in plan.targets if t.store == MEMORY_STORE):
        return []
    return [t for t in plan.targets if t.store != MEMORY_STORE and t.author == admin and admin != signer]


def check_authors(plan: ForgetPlan, perm: Permission, signer: str, who: str, bank: str,
                  also: Sequence[Target] = ()) -> None:
    """ForgetRefused unless ``signer`` (holding ``perm``) may erase every payload of the plan
    but those in ``also`` (erased with another key this node holds): its own with Write,
    anyone's with Admin."""
    others = sorted({t.author for t in plan.targets if t not in also} - {signer})
    if others and perm.level != "admin":
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        stores = ", ".join(sorted({t.store for t in plan.targets if t.author != signer and t not in also}))
        raise ForgetRefused("auth.not_admin", f"{who} may not forget {plan.key!r} in bank {bank}: some of what holds it "
                            f"was written by other keys ({shown}; {stores} payloads), and erasing another key's "
                            "writing needs Admin of the bank; nothing was erased")


def erase(db: Database, key: SigningKey, targets: Sequence[Target],
          rewrite: Sequence[tuple[str, dict[str, Any], str]] = ()) -> list[str]:
    """Write the survivors' vectors again (one entry), then erase ``targets`` in signed entries
    of at most ERASES_PER_ENTRY erase rows; the new entries' ids."""
    entries: list[str] = []
    if rewrite:
        txn = db.transaction(key)
        for store, value, _k in rewrite:
            txn.append(store, value)
        entries.append(txn.commit())
    for i in range(0, len(targets), ERASES_PER_ENTRY):
        txn = db.transaction(key)
        for t in targets[i:i + ERASES_PER_ENTRY]:
            txn.append(ERASE, EraseOp(t.entry, t.store, t.author).value())
        entries.append(txn.commit())
    return entries


def retired_payloads(db: Database, now: int, older_than_ms: int) -> list[Target]:
    """The memory payloads (and their vectors) a retention run may erase at ``now``: every memory
    row in the payload is no longer current (superseded by a newer row of its key, retired by
    another key's ``supersedes`` edge, or past its ``valid_to``) and has been so for more than
    ``older_than_ms`` (since the entry that superseded it, or since its ``valid_to``)."""
    view = MemoryView(db)  # a view of its own, read once: the service's may be lazy or mid-update
    try:
        erasable: set[str] = set()  # row keys
        for m in view.memories(include_superseded=True):
            current = view.current(m.key)
            if current is not None and current.row_key == m.row_key:
                if m.valid_to is not None and m.valid_to <= now - older_than_ms:
                    erasable.add(m.row_key)
                continue
            since = m.valid_to if (m.valid_to is not None and m.valid_to <= now) else None
            newer = view.relations(m).get("superseded_by")
            if newer is not None:
                e = db.entry(newer["entry"])
                if e is not None:
                    since = e.ts if since is None else min(since, e.ts)
            if since is not None and since <= now - older_than_ms:
                erasable.add(m.row_key)
    finally:
        view.close()
    out: set[Target] = set()
    for entry_id, rows in _by_entry(db.rows(MEMORY_STORE)).items():
        if all(r.key in erasable for r in rows):
            out.add(Target(entry_id, MEMORY_STORE, rows[0].author))
    for store, rows in _embedding_rows(db).items():
        for entry_id, in_entry in _by_entry(rows).items():
            if all(_vector_of(r) in erasable for r in in_entry):
                out.add(Target(entry_id, store, in_entry[0].author))
    return sorted(t for t in out if db.payload_state(t.entry, t.store) == "present")
