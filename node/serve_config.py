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
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, TypeVar

from memmesh.node.listen import DEFAULT_HOST, DEFAULT_PORT
from memmesh.node.settings import ApiSpec, ConfigFileError, NodeConfig, SyncSpec, applied

if TYPE_CHECKING:
    from memmesh.node.library import Node

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


class Daemon(Protocol):
    """What a reload changes in the running sync daemon (node/sync/service.py)."""

    def configure(self, *, interval_s: float, fanout: int, peers: Sequence[str]) -> None: ...


@dataclass(frozen=True)
class StartConfig:
    """What serve starts with: its flags, and the settings they resolve to over config.yaml."""

    flags: SyncFlags
    running: SyncSettings
    api: ApiSpec

    @classmethod
    def load(cls, node: Node, flags: SyncFlags) -> StartConfig:
        """Load and apply config.yaml as serve starts (on the database thread, before it
        listens). A config that cannot be used is logged (config.error) and serve goes on with
        the last good one."""
        from memmesh.node.config_apply import reload_config

        with contextlib.suppress(ConfigFileError):
            reload_config(node, event="config.loaded")
        cfg = applied(node)
        return cls(flags, flags.resolve(cfg.sync), cfg.api)


class LiveConfig:
    """The config a running serve works with: the node's Reconfigurer (node/worker.py) while
    serve runs, built from what serve started with and the daemon a reload reaches."""

    def __init__(self, start: StartConfig, daemon: Daemon) -> None:
        self.flags = start.flags
        self.running = start.running
        self.api = start.api
        self.daemon = daemon

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
            self.daemon.configure(interval_s=new.interval_s, fanout=new.fanout, peers=new.peers)
            log.info("sync.reconfigured", extra={"fields": {"interval_s": new.interval_s, "fanout": new.fanout,
                                                            "peers": list(new.peers)}})
        return warnings
