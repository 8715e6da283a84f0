"""Helpers for database tests: real keys, real entries, crafted ones for adversarial cases."""
from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from typing import Any

from memmesh.auth.keys import SigningKey
from memmesh.auth.ops import GrantOp, RevokeOp
from memmesh.crdt.database import Database
from memmesh.crdt.entry import Entry, client_id_for, sign_entry
from memmesh.crdt.storage import MemoryStorage
from memmesh.crdt.yjs import encode_rows


def key(n: int) -> SigningKey:
    return SigningKey.from_seed(bytes([n]) * 32)


def key_str(name: str) -> str:
    """A well-formed public key string for tests of the pure rules (no private key behind it)."""
    raw = hashlib.sha256(name.encode()).digest()
    return "ed25519:" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def new_db(admin: SigningKey, storage=None) -> Database:
    return Database.create(storage or MemoryStorage(), admin, meta={"kind": "bank", "display_name": "t"})


def replica(db: Database) -> Database:
    """A fresh replica of ``db`` on its own storage, fed every stored entry."""
    storage = MemoryStorage()
    storage.add_database(db.id)
    other = Database(storage, db.id)
    feed(other, db)
    return other


def feed(dst: Database, src: Database) -> None:
    """Deliver every entry src has stored to dst (a one-way sync)."""
    dst.ingest((s.header, dict(s.payloads)) for s in src.storage.entries(src.id))


def grant(db: Database, admin: SigningKey, who: SigningKey, perm: str, priority: int | None = None) -> str:
    if perm != "read" and priority is None:
        priority = 10
    return db.change_settings(admin, [GrantOp(str(who.public), perm, priority)])


def revoke(db: Database, admin: SigningKey, who: SigningKey) -> str:
    return db.change_settings(admin, [RevokeOp(str(who.public))])


def write(db: Database, who: SigningKey, value: Any, store: str = "memory") -> str:
    txn = db.transaction(who)
    txn.append(store, value)
    return txn.commit()


def craft(
    db: Database,
    who: SigningKey,
    payloads: Mapping[str, tuple[bytes, int, int]],
    *,
    parents: list[str] | None = None,
    seq: int | None = None,
    prev: str | None = "auto",
    db_id: str | None = None,
) -> Entry:
    """Sign an entry exactly as an attacker holding ``who`` could, bypassing local checks."""
    author = str(who.public)
    top = db.feeds().get(author)
    if seq is None:
        seq = 0 if top is None else top[0] + 1
    if prev == "auto":
        prev = None if top is None else top[1]
    return sign_entry(
        who, db=db_id or db.id, seq=seq, prev=prev,
        parents=parents if parents is not None else list(db.heads), ts=1, payloads=payloads,
    )


def rows_update(who: SigningKey, store: str, clock: int, values: list[Any]) -> tuple[bytes, int, int]:
    c = client_id_for(who.public.raw)
    rows = [(f"{c}/{clock + i}", v) for i, v in enumerate(values)]
    return encode_rows(c, clock, store, rows), clock, len(values)


def next_clock(db: Database, who: SigningKey, store: str) -> int:
    return db._next_clock.get((str(who.public), store), 0)


def state(db: Database) -> dict[str, Any]:
    """Everything observable: accepted set, store documents, shown rows, settings (the same
    fingerprint the simulator compares)."""
    from tests.sim import db_state

    return db_state(db)
