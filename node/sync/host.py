"""What a sync path needs of the node it runs on: a Protocol, so the core never names the
application's ``Node`` (node/library.py) at run time, and a repair (node/integrity/) can drive
the same code paths with a node that has no memory service."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    from memmesh.auth.keys import SigningKey
    from memmesh.crdt.database import Database
    from memmesh.node.memory.agents import Agents
    from memmesh.node.registry import Registry
    from memmesh.node.storage import SqliteStorage
    from memmesh.node.sync.state import SyncState
    from memmesh.node.worker import Network


class SyncHost(Protocol):
    """A node that can sync: its storage and keys, its agents and banks, its peers and network."""

    home: Path
    storage: SqliteStorage
    peer_key: SigningKey
    registry: Registry
    agents: Agents
    network: Network

    @property
    def sync(self) -> SyncState: ...

    def database(self, db_id: str) -> Database: ...

    def on_open(self, listener: Callable[[Database], None]) -> Callable[[], None]: ...
