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

Marks live in the storage's peer-local records (namespace ``checked:<db id>``), never synced:
one record per entry id, or one record for the entries one ingest or one open marks at once
(``encode_batch``). A mark names ``CHECKS_VERSION``: a release whose payload checks
differ bumps it, and every payload is checked again, once. A mark that is missing, of another
version, or does not parse (damage) is no mark: the payload gets the full check and is marked
again. A mark is bound to its entry id by a digest (a batch record to its key, which is the
digest of its value), so damage that moves or alters one is not taken for another entry's mark. Losing the marks (a repair that rebuilds the file) costs one
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


# A batch of marks (what one ingest or one open records) is one record: one row per entry cost
# as much as a tenth of accepting an entry. Its key is the digest of its value, which binds the
# two; a per-entry record (``encode_mark``) is written for a single entry and read as before.
_BATCH = "batch:"
BATCH_ENTRIES = 4096  # entries per batch record: an open that marks a whole log writes many
_BATCH_HEAD = b"B%d:" % CHECKS_VERSION
_ID_PREFIX = "sha256:"
def _raw_id(entry_id: str) -> bytes | None:
    """The 32 bytes of an id in its one spelling (``sha256:`` and 64 lowercase hex digits)."""
    if len(entry_id) != 71 or not entry_id.startswith(_ID_PREFIX):
        return None
    digits = entry_id[7:]
    try:
        raw = bytes.fromhex(digits)
    except ValueError:
        return None
    return raw if raw.hex() == digits else None


def encode_batch(marks: Mapping[str, Collection[str]]) -> tuple[str, bytes]:
    """One record marking every entry of ``marks`` (entry ids in canonical form): its key and value.
    The value is ``B<version>:`` then, per entry, its 32-byte id, a 2-byte length and the store
    names joined by ','."""
    pairs = []
    for entry_id, stores in marks.items():
        raw = _raw_id(entry_id)
        if raw is None:
            raise ValueError(f"not an entry id: {entry_id!r}")
        pairs.append((raw, frozenset(stores)))
    return _encode_batch(pairs)


def _encode_batch(pairs: Iterable[tuple[bytes, frozenset[str]]]) -> tuple[str, bytes]:
    parts = [_BATCH_HEAD]
    fields: dict[frozenset[str], bytes] = {}  # the entries of a batch mostly name the same stores
    for raw, stores in pairs:
        field = fields.get(stores)
        if field is None:
            names = ",".join(sorted(stores)).encode()
            field = fields[stores] = len(names).to_bytes(2, "big") + names
        parts += (raw, field)
    value = b"".join(parts)
    return _BATCH + hashlib.sha256(value).hexdigest()[:32], value


def decode_batch(key: str, value: bytes) -> dict[str, frozenset[str]] | None:
    """The marks a batch record holds, or None when it is not one of this version (or damaged)."""
    if (not isinstance(value, bytes) or not value.startswith(_BATCH_HEAD)
            or key != _BATCH + hashlib.sha256(value).hexdigest()[:32]):
        return None
    out: dict[str, frozenset[str]] = {}
    at, end = len(_BATCH_HEAD), len(value)
    try:
        while at < end:
            if at + 34 > end:
                return None
            entry_id = _ID_PREFIX + value[at:at + 32].hex()
            size = int.from_bytes(value[at + 32:at + 34], "big")
            at += 34
            if at + size > end:
                return None
            names = value[at:at + size].decode()
            at += size
            out[entry_id] = frozenset(names.split(",")) if names else frozenset()
    except UnicodeDecodeError:
        return None
    return out


def read_marks(storage: Storage, db_id: str) -> dict[str, frozenset[str]]:
    """entry id -> the stores its marks name (only valid marks of this version)."""
    try:
        items = storage.items_local(namespace(db_id))
    except (StorageError, TypeError, ValueError) as exc:
        # A cache: without it every payload is checked in full, which is what open did before.
        log.warning("checked marks of database %s cannot be read (%s); every payload is checked in full", db_id, exc)
        return {}
    marks: dict[str, frozenset[str]] = {}
    for key, value in items:
        if key.startswith(_BATCH):
            found = decode_batch(key, value) or {}
        else:
            stores = decode_mark(key, value)
            found = {} if stores is None else {key: stores}
        for entry_id, stores in found.items():
            # Every valid mark is a true claim about bytes its id pins: two marks of one entry add up.
            held = marks.get(entry_id)
            marks[entry_id] = stores if held is None else held | stores
    return marks


def write_marks(storage: Storage, db_id: str, marks: Mapping[str, Iterable[str]]) -> None:
    """Record marks, in one transaction; best effort (a read-only view, a full disk: the
    payloads are checked in full on the next open instead)."""
    if not marks:
        return
    many = len(marks) > 1
    single: list[tuple[str, frozenset[str]]] = []
    batched: list[tuple[bytes, frozenset[str]]] = []
    for entry_id, stores in marks.items():
        raw = _raw_id(entry_id) if many else None
        if raw is None:
            single.append((entry_id, frozenset(stores)))
        else:
            batched.append((raw, frozenset(stores)))
    try:
        items = [(i, encode_mark(i, s)) for i, s in single]
        items += [_encode_batch(batched[start:start + BATCH_ENTRIES])
                  for start in range(0, len(batched), BATCH_ENTRIES)]
        storage.put_local_many(namespace(db_id), items)
    except (StorageError, OverflowError) as exc:  # OverflowError: store names past 64 KiB in all
        log.debug("checked marks of database %s not written (%s)", db_id, exc)
