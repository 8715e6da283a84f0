"""What a SyncServer asks of a node (node/sync/protocol.py ``ServedNode``), for one database
readable by every caller: the tests that drive the sync server without a node use this."""
from __future__ import annotations

from typing import Any

from memmesh.crdt.database import Database
from memmesh.node.sync import messages as m


class Served:
    def __init__(self, db: Database) -> None:
        self.db = db

    def readable(self, db_id: str, caller: str) -> Database | None:
        return self.db if db_id == self.db.id else None

    def peers_of(self, db_id: str, caller: str) -> list[m.PeerInfo]:
        return []

    def learn_peers(self, db_id: str, caller: str, peers: list[m.PeerInfo]) -> None:
        pass

    def redeem(self, *args: Any) -> None:
        return None
