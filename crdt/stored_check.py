"""Is a stored entry still what was stored? (sans-IO; used on load and by `memmesh check`.)

An entry's id is the sha256 of its signed header, and the header holds the sha256 of every
payload, so damage to either is found by hashing alone; the signature is checked only when
asked (it is most of the cost, and the bytes were verified before they were first stored).
A forged entry that is consistent with its own id cannot come from disk damage: it needs write
access to the file, which the signature check of `memmesh check` catches.
"""
from __future__ import annotations

from dataclasses import dataclass

from memmesh.crdt.entry import Entry, decode_entry, id_of
from memmesh.crdt.errors import RejectedError
from memmesh.crdt.storage import StoredEntry

__all__ = ["Damage", "check_stored"]


@dataclass(frozen=True, slots=True)
class Damage:
    """One stored entry that fails its checks."""

    entry_id: str  # the id it is stored under
    reason: str  # "entry.id" (header bytes changed) or the decoder's code (entry.payload, entry.signature, ...)
    detail: str


def check_stored(stored: StoredEntry, db_id: str, *, signature: bool = False) -> Entry | Damage:
    """The decoded entry if ``stored`` is intact, else what is wrong with it."""
    header = stored.header
    if id_of(header) != stored.id:
        return Damage(stored.id, "entry.id", "its header bytes no longer hash to its id")
    try:
        return decode_entry(header, stored.payloads, expected_db=db_id, verify_signature=signature)
    except RejectedError as exc:
        return Damage(stored.id, exc.reason, str(exc))
