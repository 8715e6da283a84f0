"""How `memmesh serve` takes its settings from config.yaml, and what a reload changes in it.

Each sync setting resolves as: serve's flag (when given) > config.yaml's ``sync`` section >
the built-in default. A reload (SIGHUP, `memmesh reload`) changes the daemon's interval,
fan-out and configured peers at once; where serve listens, the address it advertises,
discovery and the HTTP API stay as serve started, and the reload's result says so.
"""
from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

from memmesh.node.listen import DEFAULT_HOST, DEFAULT_PORT
from memmesh.node.settings import ApiSpec, ConfigFileError, NodeConfig, SyncSpec, applied

if TYPE_CHECKING:
    from memmesh.node.library import Node
    from memmesh.node.sync.service import SyncService

log = logging.getLogger("memmesh.serve")
RESTART_ONLY = ("listen", "advertise", "discovery")
T = TypeVar("T")


@dataclass(frozen=True)
class SyncSettings:
    """What serve's sync side runs with."""

    listen: str
    advertise: str | None
    discovery: bool
    interval_s: float
    fanout: int
    peers: tuple[str, ...] = ()


@dataclass(frozen=True)
class SyncFlags:
    """serve's command-line flags; None: not given."""

    listen: str | None = None
    advertise: str | None = None
    discovery: bool | None = None
    interval_s: float | None = None
    fanout: int | None = None

    def resolve(self, spec: SyncSpec) -> SyncSettings:
        return SyncSettings(
            listen=_pick(self.listen, spec.listen) or f"{DEFAULT_HOST}:{DEFAULT_PORT}",
            advertise=_pick(self.advertise, spec.advertise),
            discovery=_pick(self.discovery, spec.discovery),
            interval_s=_pick(self.interval_s, spec.interval_s),
            fanout=_pick(self.fanout, spec.fanout),
            peers=tuple(spec.peers),
        )


def _pick(flag: T | None, configured: T) -> T:
    return configured if flag is None else flag


class LiveConfig:
    """The config a running serve works with; ``reconfigure`` is its ``node.network`` hook."""

    def __init__(self, flags: SyncFlags, running: SyncSettings, api: ApiSpec) -> None:
        self.flags = flags
        self.running = running
        self.api = api
        self.sync: "SyncService | None" = None

    @classmethod
    def start(cls, node: "Node", flags: SyncFlags) -> "LiveConfig":
        """Load and apply config.yaml as serve starts (on the database thread, before it
        listens). A config that cannot be used is logged (config.error) and serve goes on with
        the last good one."""
        from memmesh.node.config_apply import reload_config

        with contextlib.suppress(ConfigFileError):
            reload_config(node, event="config.loaded")
        cfg = applied(node)
        return cls(flags, flags.resolve(cfg.sync), cfg.api)

    def attach(self, node: "Node", sync: "SyncService") -> None:
        self.sync = sync
        node.network.reconfigure = self.reconfigure

    def reconfigure(self, cfg: NodeConfig) -> list[str]:
        """Apply what can change live (on the database thread); what needs a restart, for people."""
        new = self.flags.resolve(cfg.sync)
        warnings = [f"sync.{k} is now {json.dumps(getattr(new, k))} in config.yaml, but serve keeps "
                    f"{json.dumps(getattr(self.running, k))} until it restarts"
                    for k in RESTART_ONLY if getattr(new, k) != getattr(self.running, k)]
        if cfg.api != self.api:
            warnings.append("the api section changed in config.yaml; the HTTP API keeps its address and access "
                            "until serve restarts")
        live = (new.interval_s, new.fanout, new.peers)
        if live != (self.running.interval_s, self.running.fanout, self.running.peers):
            self.running = replace(self.running, interval_s=new.interval_s, fanout=new.fanout, peers=new.peers)
            if self.sync is not None:
                self.sync.configure(interval_s=new.interval_s, fanout=new.fanout, peers=new.peers)
            log.info("sync.reconfigured", extra={"fields": {"interval_s": new.interval_s, "fanout": new.fanout,
                                                            "peers": list(new.peers)}})
        return warnings
