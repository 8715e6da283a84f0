"""Whom a bank may leave this node for: the one rule every sync path asks.

The daemon's rounds, the one-shot `memmesh sync` (and integrity's fetch from peers, which runs
it), peer exchange in both directions and the sync server's reads all ask ``refusal`` (or
``may_read``) about a key and a database at the moment they are about to send: a key may be
sent a bank, or be named to others as a peer of it, only while it holds Read or more in the
bank's settings as this node has them now (``Database.permission``: what the validity rule
derived from the signed log). Nothing is cached from when a peer was learnt, so a revocation
or a removed grant stops everything from the next exchange on, on every node that holds it.

An invite key this node issued is never a reader either, whatever the settings say of it (an
older version granted invite keys Read): its holder redeems it and syncs under its own key.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from memmesh.auth.permissions import READ_LEVEL, holds
from memmesh.crdt.database import Database
from memmesh.node.sync.messages import PeerInfo

if TYPE_CHECKING:
    from memmesh.node.sync.host import SyncHost

NO_GRANT = "sync.no_grant"


def refusal(node: SyncHost, db: Database, key: str) -> str | None:
    """Why nothing of ``db`` may go to ``key`` now (one line naming the bank), or None when it
    may: it holds Read or more in the bank's settings as this node has them."""
    if node.sync.is_invite(key):
        return f"{key} is an invite of {_bank(node, db)}: it may only be redeemed"
    if holds(db.permission(key), READ_LEVEL):
        return None
    state = db.settings().get(key)
    why = " (its grant was revoked)" if state is not None and state.status != "active" else ""
    return f"{key} holds no grant on {_bank(node, db)}{why}"


def may_read(node: SyncHost, db: Database, key: str) -> bool:
    return refusal(node, db, key) is None


def readers(node: SyncHost, db: Database, peers: Iterable[PeerInfo]) -> list[PeerInfo]:
    """The peers among ``peers`` that may read ``db`` now (peer exchange, both directions)."""
    return [p for p in peers if may_read(node, db, p.key)]


def _bank(node: SyncHost, db: Database) -> str:
    return node.agents.name_of(db.id)  # the local name, else the display name, else the id
