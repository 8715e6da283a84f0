"""Quarantine of a writer: signed rows that hide one key's memory rows, the same on every replica.

A quarantine is a row of the bank's ``quarantine`` store (append-only and signed like every
row; docs/memory.md, "Quarantine"). The two row shapes, exactly:

    {"op": "quarantine", "key": K, "from": ISO | null, "to": ISO | null}
    {"op": "release", "quarantine": ENTRY_ID}

K is a canonical ``ed25519:`` public key. ``from`` (inclusive) and ``to`` (exclusive) bound the
*signed entry timestamp* (``RowRecord.ts``, ms) of the rows hidden; null is unbounded. A
quarantine's id is the id of the entry that holds it: the local command writes one row per
entry, and of a received entry only its first well-formed quarantine row is read.

Any key that may write can put a row in the store; which rows *count* is decided here from
signed facts only (the rows, their entries' causal pasts and the settings there), so every
replica holding the same entries folds the same quarantines:

* a quarantine row of entry E counts iff E's author holds Admin in the settings of E's causal
  past (``Database.settings_at``) and ``may_change(author's permission, K's permission there,
  None)`` allows it: the revocation rule, so nobody quarantines a key holding a stronger
  priority, and a key granted nothing there may be quarantined;
* a release row of entry R counts iff the quarantine counts, its entry is in R's causal past,
  and R's author holds Admin in R's past with a priority number at most the quarantiner's at E
  (at least as strong as whoever quarantined). The first counting release in T order is the
  one named; later ones change nothing.

Revoking the admin later does not undo its quarantine (as with its grants): E is judged by its
own past. An E voided by the validity rule (its author revoked concurrently) is not shown by
the database, so it does not count either. Malformed rows are ignored, logged at debug.

Nothing is deleted: a quarantine only hides (``hidden_mask``), and a release shows again
exactly what it hid.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from memmesh.auth.errors import AuthError
from memmesh.auth.ops import check_key
from memmesh.auth.permissions import ADMIN, AuthSettings, may_change
from memmesh.crdt.database import Database, RowRecord

from .rows import MemoryInputError, check_time, iso_utc
from .timeline import check_entry_id

__all__ = ["QUARANTINE_STORE", "Quarantine", "hidden_mask", "hides", "quarantine_value", "quarantines",
           "release_value"]

log = logging.getLogger(__name__)

QUARANTINE_STORE = "quarantine"
_QUARANTINE_FIELDS = frozenset({"op", "key", "from", "to"})
_RELEASE_FIELDS = frozenset({"op", "quarantine"})


@dataclass(frozen=True)
class Quarantine:
    """One quarantine that counts (see the module docstring for the rules)."""

    id: str  # the id of the entry that holds it
    key: str  # the quarantined public key
    start: int | None  # ms, inclusive (None: from the beginning)
    end: int | None  # ms, exclusive (None: no end)
    by: str  # the admin key that signed it
    ts: int  # its entry's timestamp (ms)
    released_by: str | None = None  # the entry id of the release that counts (the first in T order)
    released_ts: int | None = None

    @property
    def active(self) -> bool:
        return self.released_by is None

    def covers(self, author: str, ts: int) -> bool:
        """Whether a row signed by ``author`` in an entry stamped ``ts`` is in its range
        (released or not)."""
        return (author == self.key and (self.start is None or ts >= self.start)
                and (self.end is None or ts < self.end))


# ---------------------------------------------------------------------------------- row values
def _check_ms(what: str, ms: Any) -> str | None:
    if ms is None:
        return None
    text = iso_utc(ms) if type(ms) is int else None
    if text is None:
        raise MemoryInputError(f"{what} must be a time in ms since the epoch within years 1-9999, got {ms!r}")
    return text


def quarantine_value(key: str, start: int | None, end: int | None) -> dict[str, Any]:
    """The row that quarantines ``key``'s rows stamped in [start, end) (ms; None: unbounded);
    MemoryInputError if any part is malformed."""
    try:
        check_key(key)
    except AuthError:
        raise MemoryInputError(f"a quarantine names a public key (ed25519: and 43 base64url characters), "
                               f"got {key!r}") from None
    start_iso, end_iso = _check_ms("from", start), _check_ms("to", end)
    if start is not None and end is not None and start >= end:
        raise MemoryInputError(f"from ({start_iso}) must be before to ({end_iso}): the range would hide nothing")
    return {"op": "quarantine", "key": key, "from": start_iso, "to": end_iso}


def release_value(quarantine_id: str) -> dict[str, Any]:
    """The row that releases the quarantine held by entry ``quarantine_id``."""
    return {"op": "release", "quarantine": check_entry_id("quarantine", quarantine_id)}


def _time(value: Any) -> int | None:
    return None if value is None else check_time("time", value)


def _parse(row: RowRecord) -> tuple[str, Any, Any, Any] | None:
    """("quarantine", key, start, end) or ("release", id, None, None); None if malformed."""
    v = row.value
    try:
        if not isinstance(v, dict) or not all(type(k) is str for k in v):
            raise MemoryInputError("the value is not an object with text field names")
        if v.get("op") == "quarantine" and frozenset(v) == _QUARANTINE_FIELDS:
            key = v["key"]
            try:
                check_key(key)
            except AuthError as exc:
                raise MemoryInputError(str(exc)) from None
            start, end = _time(v["from"]), _time(v["to"])
            if start is not None and end is not None and start >= end:
                raise MemoryInputError("from is not before to")
            return ("quarantine", key, start, end)
        if v.get("op") == "release" and frozenset(v) == _RELEASE_FIELDS:
            return ("release", check_entry_id("quarantine", v["quarantine"]), None, None)
        raise MemoryInputError("not one of the two row shapes (quarantine, release)")
    except MemoryInputError as exc:
        log.debug("ignoring quarantine row %s of entry %s: %s", row.key, row.entry_id, exc)
        return None


# ---------------------------------------------------------------------------------- the fold
def quarantines(db: Database) -> list[Quarantine]:
    """Every quarantine of ``db`` that counts, in T order, with the release that counts."""
    pasts: dict[str, AuthSettings | None] = {}

    def settings(entry_id: str) -> AuthSettings:
        if entry_id not in pasts:
            pasts[entry_id] = db.settings_at(entry_id)
        return pasts[entry_id] or AuthSettings()

    found: dict[str, Quarantine] = {}
    strength: dict[str, int] = {}  # quarantine id -> its signer's admin priority at E
    read: set[str] = set()  # entries whose quarantine row was read (one per entry)
    for row in db.rows(QUARANTINE_STORE):  # T order: a release's quarantine comes before it
        parsed = _parse(row)
        if parsed is None:
            continue
        kind, target, start, end = parsed
        if kind == "quarantine":
            if row.entry_id in read:
                continue
            read.add(row.entry_id)
            past = settings(row.entry_id)
            actor = past.permission(row.author)
            refused = may_change(actor, past.permission(target), None)
            if refused is not None:
                log.debug("quarantine in entry %s does not count: %s (%s holds %s there)",
                          row.entry_id, refused, row.author, actor)
                continue
            assert actor is not None and actor.priority is not None
            found[row.entry_id] = Quarantine(row.entry_id, target, start, end, row.author, row.ts)
            strength[row.entry_id] = actor.priority
            continue
        q = found.get(target)
        if q is None or not q.active or not db.precedes(q.id, row.entry_id):
            continue  # unknown (or not counting), already released, or not in the release's past
        actor = settings(row.entry_id).permission(row.author)
        if actor is None or actor.level != ADMIN or (actor.priority or 0) > strength[q.id]:
            log.debug("release in entry %s does not count: %s holds %s, the quarantine needs Admin(%d) or stronger",
                      row.entry_id, row.author, actor, strength[q.id])
            continue
        found[q.id] = replace(q, released_by=row.entry_id, released_ts=row.ts)
    return list(found.values())


def hides(qs: Sequence[Quarantine], author: str, ts: int) -> bool:
    """Whether an active quarantine of ``qs`` covers a row of ``author`` stamped ``ts``."""
    return any(q.active and q.covers(author, ts) for q in qs)


def hidden_mask(qs: Sequence[Quarantine], authors: Mapping[str, int],
                author_col: np.ndarray, ts_col: np.ndarray) -> np.ndarray | None:
    """True where an active quarantine covers the doc: ``authors`` maps public keys to the ids
    ``author_col`` holds, ``ts_col`` the entries' timestamps (ms), one value per doc. None when
    nothing is hidden (no active quarantine names a present author, or none covers a doc), so
    callers skip the mask."""
    mask: np.ndarray | None = None
    for q in qs:
        if not q.active or q.key not in authors:
            continue
        hit = author_col == authors[q.key]
        if q.start is not None:
            hit &= ts_col >= q.start
        if q.end is not None:
            hit &= ts_col < q.end
        mask = hit if mask is None else mask | hit
    return mask if mask is not None and mask.any() else None
