"""The sync side of a serving node: the peer API, the sync daemon, LAN discovery, status.

(Being built: the interface ``memmesh serve`` uses is fixed here.)
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from node.library import Node


class SyncService:
    def __init__(self, node: "Node", *, address: str, discovery: bool = True, interval_s: float = 5.0,
                 fanout: int = 3) -> None:
        self.node = node
        self.address = address  # the address hint peers reach this node at: "http:host:port"
        self.discovery = discovery
        self.interval_s = interval_s
        self.fanout = fanout

    def add_routes(self, app: web.Application) -> None:
        """Add the peer sync API (/sync/v1/*) to the serve app."""

    async def start(self) -> None:
        """Start the daemon (and discovery); node.network is already pointed at serve's loop."""

    async def stop(self) -> None:
        """Stop the daemon and discovery; in-flight exchanges end; nothing acknowledged is lost."""

    def status(self) -> dict[str, Any]:
        return {}
