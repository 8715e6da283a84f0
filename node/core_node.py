"""The node of the core: a home with its agents, its peers and a network to reach them.

What syncing needs (node/sync/host.py's SyncHost): the readers rule asks the agents' names
(node/sync/readers.py), a fetch lifts write fences (node/fence.py). A repair opens exactly
this (node/integrity/run.py: no memory service, no embedder); the application's ``Node``
(node/library.py) builds on it with the memory service and serve's hand-over."""
from __future__ import annotations

from pathlib import Path

from memmesh.auth.keys import SigningKey
from memmesh.node.fence import install as install_fence
from memmesh.node.home import Home
from memmesh.node.memory.agents import Agents
from memmesh.node.storage import SqliteStorage
from memmesh.node.sync.state import SyncState
from memmesh.node.worker import Network


class CoreNode(Home):
    """A home that can sync (node/sync/host.py's SyncHost); it owns ``storage`` and ``lock_fd``."""

    def __init__(self, home: Path, storage: SqliteStorage, peer_key: SigningKey, lock_fd: int | None = None) -> None:
        super().__init__(home, storage, peer_key, lock_fd)
        self.agents = Agents(self)
        self.network = Network()  # offline: serve hands the application's Node its own for its run
        self._sync: SyncState | None = None  # read from storage when first asked
        install_fence(self)  # as on every node: a fenced database refuses local writes

    @property
    def sync(self) -> SyncState:
        """What this node shares, the peers it knows, its invites and its links' status."""
        if self._sync is None:
            self._sync = SyncState(self.storage, str(self.peer_key.public))
        return self._sync
