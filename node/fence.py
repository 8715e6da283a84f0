"""The write fence: no local write to a database until this node has its own later entries back.

One key writes from one place (docs/security.md, "Equivocation"). A node that lost entries its
own keys signed, while a peer may still hold them, would sign its next write at a feed position
(author, seq) it already used: two entries at one (author, seq), and every peer flags the key
for good. Two ways to get there:

* ``memmesh restore``: the agents may have written after the backup was taken;
* ``memmesh check --repair``: whole entries signed by a key of this home were lost (damaged,
  and no reachable peer gave them back), or entries whose author could not be read.

Each sets a fence on the database (a peer-local record, never synced: namespace ``fence``, key
the database id, a JSON :class:`Fence`). While it stands every local write is refused with
:class:`WriteFenced` (remember, settings, erase: ``Database._commit_local`` calls the guard
that :func:`install` puts on every database the node opens). Reads, recall and entries
received from peers are never fenced; neither is creating a database.

It lifts by itself after a sync exchange of the database completes (serve's daemon or
`memmesh sync`, :func:`after_exchange`) once this node holds, for each of its keys, at least
the part of the key's feed the peer showed in that exchange (restore) and every position the
repair lost (repair). ``memmesh unfence`` lifts it by hand.

Who can hold the database besides this node (:func:`held_elsewhere`): it is shared, or the
peer book or a sync link names a peer for it, or its settings name a key (granted or revoked)
that this home does not hold. A database for which none of that is true is never fenced: no
other node can have an entry of it, so a write at a reused position contradicts nothing.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from memmesh.auth.errors import MemmeshError
from memmesh.crdt.database import Database
from memmesh.crdt.storage import Storage
from memmesh.node.file_check import clean, damaged

if TYPE_CHECKING:
    from memmesh.node.registry import AgentRecord, BankRecord
    from memmesh.node.sync.host import SyncHost
    from memmesh.node.sync.state import SyncState

log = logging.getLogger("memmesh.fence")

NS_FENCE = "fence"
RESTORE = "restore"
REPAIR = "repair"


class WriteFenced(MemmeshError):
    """A local write to a database whose fence stands; nothing was written."""


@dataclass
class Fence:
    db: str
    reason: str  # RESTORE or REPAIR: the latest event that set it
    since_ms: int
    keys: list[str]  # this home's public keys when it was set: the feeds that must be back
    # Lift only after an exchange after which our feeds of ``keys`` cover what the peer showed
    # (a restore: nobody knows what was written after the backup).
    catch_up: bool = True
    lost: dict[str, int] = field(default_factory=dict)  # author -> highest seq a repair lost

    def merged(self, newer: Fence) -> Fence:
        """Both conditions hold until both are met: a repair of a restored home keeps the catch-up."""
        lost = dict(self.lost)
        for author, seq in newer.lost.items():
            lost[author] = max(seq, lost.get(author, -1))
        return Fence(self.db, newer.reason, newer.since_ms, sorted(set(self.keys) | set(newer.keys)),
                     self.catch_up or newer.catch_up, lost)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def utc(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


# ----------------------------------------------------------------------------- records
def _decode(storage: Storage, db_id: str, raw: bytes) -> Fence:
    try:
        value = json.loads(raw)
        fence = Fence(**value)
        if not (isinstance(fence.keys, list) and isinstance(fence.lost, dict) and isinstance(fence.since_ms, int)):
            raise TypeError("a field has the wrong type")
        return fence
    except (TypeError, ValueError) as exc:
        raise damaged(str(getattr(storage, "path", "the storage")),
                      f"its peer-local record {NS_FENCE}/{clean(db_id, 80)} cannot be read: {clean(exc, 80)}") from exc


def read(storage: Storage, db_id: str) -> Fence | None:
    raw = storage.get_local(NS_FENCE, db_id)
    return None if raw is None else _decode(storage, db_id, raw)


def fences(storage: Storage) -> list[Fence]:
    return [_decode(storage, key, raw) for key, raw in storage.items_local(NS_FENCE)]


def set_many(storage: Storage, new: Iterable[Fence]) -> None:
    """Set these fences in one transaction (a fence already there keeps its conditions too)."""
    items = []
    for fence in new:
        old = read(storage, fence.db)
        fence = old.merged(fence) if old is not None else fence
        items.append((fence.db, json.dumps(fence.as_dict(), sort_keys=True).encode()))
    if items:
        storage.put_local_many(NS_FENCE, items)


def lift(storage: Storage, db_id: str) -> Fence | None:
    """Remove the fence; the one that stood (None: there was none)."""
    fence = read(storage, db_id)
    if fence is not None:
        storage.delete_local(NS_FENCE, db_id)
    return fence


# ----------------------------------------------------------------------------- the rule
def held_elsewhere(sync: SyncState, db_id: str, db: Database | None, own_keys: set[str]) -> bool:
    """May another node hold entries of this database? (The module docstring gives the rule.)
    ``db`` None (it could not be opened): assume so."""
    if sync.is_shared(db_id) or sync.peers.peers(db_id) or sync.links(db_id):
        return True
    if db is None:
        return True
    return any(key not in own_keys for key in db.settings())  # revoked keys too


def caught_up(fence: Fence, ours: Mapping[str, tuple[int, str]], theirs: Mapping[str, tuple[int, str]]) -> bool:
    """After an exchange: ``ours`` this node's feeds now, ``theirs`` the peer's at the exchange."""
    if fence.catch_up:
        for key in fence.keys:
            if key in theirs and ours.get(key, (-1, ""))[0] < theirs[key][0]:
                return False
    return all(ours.get(author, (-1, ""))[0] >= seq for author, seq in fence.lost.items())


# ----------------------------------------------------------------------------- the node
def registered_name(node: SyncHost, db_id: str) -> str:
    """A name `memmesh unfence` takes for the database: its bank or agent name, else its id."""
    records: list[BankRecord | AgentRecord] = [*node.registry.banks(), *node.registry.agents()]
    for rec in records:
        if rec.db_id == db_id:
            return rec.name
    return db_id


def why(fence: Fence) -> str:
    return (f"restored from a backup ({utc(fence.since_ms)})" if fence.reason == RESTORE
            else f"lost entries its own keys signed in memmesh check --repair ({utc(fence.since_ms)})")


def message(fence: Fence, name: str) -> str:
    if fence.reason == RESTORE:
        return (f"database {name} was restored from a backup ({utc(fence.since_ms)}): its agents may have written "
                "after the backup, and writing again before those entries are back would flag their keys for "
                "equivocation on every peer; run memmesh sync (serve syncs by itself), or memmesh unfence "
                f"{name} if no peer has this database")
    return (f"database {name} lost entries its own keys signed in memmesh check --repair ({utc(fence.since_ms)}), "
            "and a peer that was not reachable may still hold them: writing again before those entries are back "
            "would flag their keys for equivocation on every peer; run memmesh sync (serve syncs by itself), or "
            f"memmesh unfence {name} if no peer has them")


def install(node: SyncHost) -> None:
    """Put the guard on every database the node opens or creates (called once per node)."""
    def guard_of(db: Database) -> None:
        def guard() -> None:
            raw = node.storage.get_local(NS_FENCE, db.id)  # one indexed read per write
            if raw is not None:
                raise WriteFenced(message(_decode(node.storage, db.id, raw), registered_name(node, db.id)))

        db.write_guard = guard

    node.on_open(guard_of)


def after_exchange(node: SyncHost, db: Database, peer: str, stats: Any) -> Fence | None:
    """A sync exchange of ``db`` with ``peer`` completed (``stats``: protocol.ExchangeStats):
    lift the fence if this node now holds what the peer showed of its own feeds. The fence
    lifted, if it was."""
    fence = read(node.storage, db.id)
    if fence is None or stats.peer_feeds is None:
        return None
    if not caught_up(fence, db.feeds(), stats.peer_feeds):
        log.info("write fence on %s stays after the sync with %s: this node still lacks some of its own entries",
                 registered_name(node, db.id), peer[:20])
        return None
    node.storage.delete_local(NS_FENCE, db.id)
    log.info("write fence on %s lifted: synced with %s", registered_name(node, db.id), peer[:20])
    return fence


def status(node: SyncHost) -> list[dict[str, Any]]:
    """The fenced databases, for `memmesh status`."""
    return [{"db": f.db, "name": registered_name(node, f.db), "reason": f.reason, "since_ms": f.since_ms,
             "why": why(f)} for f in fences(node.storage)]
