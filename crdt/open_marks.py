"""Per stored entry, which of its payloads passed this release's payload checks (the "checked"
marks), so that opening a database does not decode them again.

A payload's bytes are pinned by the entry id: the id is the sha256 of the header, the header
holds the payload's sha256, and open hashes both (crdt/stored_check.py). The shape checks
(crdt/records.py ``check_payload_shape``) are a function of those bytes and the header alone,
so once a payload passed them, any payload that still hashes to the same digest passes them
again. A mark records that, for the stores whose rows are also keyed by their own clocks
(``f"{client}/{clock}"``, as every transaction writes them): what open needs of such a payload
is then known from the header alone (crdt/row_keys.py). Settings and erase payloads are never
marked: open needs their operations, and they are small.

Marks live in the storage's peer-local records (namespace ``checked:<db id>``, one record per
entry id), never synced. A mark names ``CHECKS_VERSION``: a release whose payload checks
differ bumps it, and every payload is checked again, once. A mark that is missing, of another
version, or does not parse (damage) is no mark: the payload gets the full check and is marked
again. A mark is bound to its entry id by a digest, so damage that moves or alters one is not
taken for another entry's mark. Losing the marks (a repair that rebuilds the file) costs one
slow open, never a check.
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Collection, Iterable, Mapping

from memmesh.crdt.errors import StorageError
from memmesh.crdt.storage import Storage

log = logging.getLogger("memmesh.crdt.database")

# Bump when check_payload_shape, decode_append_update or the row-key rule accept a different set
# of payloads: marks of another version are ignored.
CHECKS_VERSION = 1
_DIGEST = 8


def namespace(db_id: str) -> str:
    return f"checked:{db_id}"


def _body(stores: Collection[str]) -> bytes:
    # Store names never hold ',' (crdt.records.STORE_NAME_CHARS).
    return f"{CHECKS_VERSION}:{','.join(sorted(stores))}".encode()


def _bind(entry_id: str, body: bytes) -> bytes:
    return hashlib.sha256(entry_id.encode() + b"\x00" + body).digest()[:_DIGEST]


def encode_mark(entry_id: str, stores: Collection[str]) -> bytes:
    body = _body(stores)
    return body + _bind(entry_id, body)


def decode_mark(entry_id: str, value: bytes) -> frozenset[str] | None:
    """The stores a mark names, or None when it is not a mark of this version for this entry."""
    if not isinstance(value, bytes) or len(value) <= _DIGEST:
        return None
    body, digest = value[:-_DIGEST], value[-_DIGEST:]
    if _bind(entry_id, body) != digest:
        return None
    try:
        version, _, names = body.decode().partition(":")
    except UnicodeDecodeError:
        return None
    if version != str(CHECKS_VERSION):
        return None
    return frozenset(names.split(",")) if names else frozenset()


def read_marks(storage: Storage, db_id: str) -> dict[str, frozenset[str]]:
    """entry id -> the stores its mark names (only valid marks of this version)."""
    try:
        items = storage.items_local(namespace(db_id))
    except (StorageError, TypeError, ValueError) as exc:
        # A cache: without it every payload is checked in full, which is what open did before.
        log.warning("checked marks of database %s cannot be read (%s); every payload is checked in full", db_id, exc)
        return {}
    marks: dict[str, frozenset[str]] = {}
    for entry_id, value in items:
        stores = decode_mark(entry_id, value)
        if stores is not None:
            marks[entry_id] = stores
    return marks


def write_marks(storage: Storage, db_id: str, marks: Mapping[str, Iterable[str]]) -> None:
    """Record marks, in one transaction; best effort (a read-only view, a full disk: the
    payloads are checked in full on the next open instead)."""
    if not marks:
        return
    items = [(entry_id, encode_mark(entry_id, frozenset(stores))) for entry_id, stores in marks.items()]
    try:
        storage.put_local_many(namespace(db_id), items)
    except StorageError as exc:
        log.debug("checked marks of database %s not written (%s)", db_id, exc)
