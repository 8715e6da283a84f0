"""One run of `memmesh serve`, built from its parts (docs/operations.md, "Running serve").

``Server(node, options).run()`` starts, in order: the database thread and the event bus, the
config in force (node/serve_config.py), the listening sockets, the sync service, the node's
network for this run (node/worker.py: serve's executor, bus, daemon and live config), then the
sync API, the control channel and the HTTP API; it writes serve.json once everything answers.
On SIGINT or SIGTERM it stops in the reverse order (node/serve.py's docstring has the why).
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from memmesh.auth.errors import MemmeshError
from memmesh.node.api.address import api_listen as resolve_api_listen
from memmesh.node.api.app import build_app
from memmesh.node.api.live import Live
from memmesh.node.api_token import ensure_token
from memmesh.node.binding import bind_control_socket, bind_listen, host_port
from memmesh.node.commands import REGISTRY, Result
from memmesh.node.commands.registry import Registry
from memmesh.node.config_apply import reload_config
from memmesh.node.conn_limits import Limits, reserve_fds
from memmesh.node.control import SERVE_JSON, SERVE_SOCK, ServeError, read_info, remove_files
from memmesh.node.control_server import CommandRunner, ControlChannel
from memmesh.node.events import DatabaseWatch, EventBus
from memmesh.node.listeners import GuardedSite
from memmesh.node.serve_config import LiveConfig, StartConfig, SyncFlags
from memmesh.node.serve_log import access_log, event, flush_repeats_every
from memmesh.node.settings import ApiSpec
from memmesh.node.sync.messages import MAX_BODY_BYTES
from memmesh.node.sync.service import SyncService
from memmesh.node.worker import DbThread, Network, OnServeLoop

if TYPE_CHECKING:
    from memmesh.node.library import Node

__all__ = ["DRAIN_S", "ServeOptions", "Server", "bind_api", "start_api", "write_info"]

DRAIN_S = 10.0  # how long in-flight requests get to finish on shutdown
SNAPSHOT_EVERY_S = 300.0  # how often views due a snapshot write one (node/memory/snapshot.py)
WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]")


@dataclass(frozen=True)
class ServeOptions:
    """What one run is started with: serve's sync flags and API flag, the command registry the
    control channel runs, the connection limits, the log handler whose repeats are flushed."""

    flags: SyncFlags = field(default_factory=SyncFlags)
    api_listen: str | None = None
    registry: Registry = REGISTRY
    limits: Limits = field(default_factory=Limits)
    log_handler: logging.Handler | None = None


class Signals:
    """SIGINT and SIGTERM stop serve (once); SIGHUP reloads config.yaml once serve has read it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.stop = asyncio.Event()
        self.by: str | None = None  # the signal that stopped serve
        self.reload: Callable[[], Awaitable[None]] | None = None  # once the config is read: what SIGHUP runs
        self._installed: list[signal.Signals] = []

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may handle signals (a test's serve in a thread)
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.loop.add_signal_handler(sig, self._stop, sig)
            self._installed.append(sig)
        self.loop.add_signal_handler(signal.SIGHUP, self._hangup)
        self._installed.append(signal.SIGHUP)

    def remove(self) -> None:
        for sig in self._installed:
            self.loop.remove_signal_handler(sig)

    def _stop(self, sig: signal.Signals) -> None:
        if self.by is not None:
            event("signal", signal=sig.name, note="already stopping")
            return
        self.by = sig.name
        self.stop.set()

    def _hangup(self) -> None:
        if self.by is not None or self.reload is None:
            event("signal", signal="SIGHUP", note="not reloading config.yaml: serve is " +
                  ("stopping" if self.by is not None else "starting (and reads it as it starts)"))
            return
        event("signal", signal="SIGHUP", note="reloading config.yaml")
        asyncio.ensure_future(self.reload())


class Bound:
    """The listening sockets of a run, each closed on the way out unless a site took it."""

    def __init__(self) -> None:
        self._socks: dict[str, socket.socket | None] = {}

    def add(self, name: str, sock: socket.socket | None) -> None:
        self._socks[name] = sock

    def get(self, name: str) -> socket.socket | None:
        return self._socks.get(name)

    def take(self, name: str) -> socket.socket | None:
        return self._socks.pop(name, None)

    def close(self) -> None:
        for sock in self._socks.values():
            if sock is not None:
                sock.close()
        self._socks.clear()


class Server:
    """One serve run of an open node (its caller holds the home and closes the node after)."""

    def __init__(self, node: Node, options: ServeOptions) -> None:
        self.node = node
        self.options = options
        self.bound = Bound()
        self.runners: list[web.AppRunner] = []
        self.info: dict[str, Any] = {}  # serve.json, once everything answers
        self._serving = contextlib.ExitStack()  # the node's network for this run
        self._sync: SyncService | None = None
        self._sync_started = False

    async def run(self) -> Result:
        loop = asyncio.get_running_loop()
        node = self.node
        signals = Signals(loop)
        signals.install()
        event("start", home=str(node.home), pid=os.getpid(), node_key=str(node.peer_key.public))
        net_limits, ctl_limits = self._limits()
        flusher = asyncio.ensure_future(flush_repeats_every(self.options.log_handler))
        snapshots = asyncio.ensure_future(_save_snapshots_every(node, SNAPSHOT_EVERY_S))
        _remove_stale(node.home)
        db = DbThread()
        # The live event stream (node/events.py): the databases, the daemon and the sharing
        # commands publish onto it from here on; GET /v1/events follows it.
        bus = EventBus()
        bus.attach(loop)
        watch = DatabaseWatch(node, bus.publish)
        try:
            await db.run(watch.start)
            # config.yaml before anything listens: it may say where (serve's flags win over it)
            start = await db.run(lambda: StartConfig.load(node, self.options.flags))
            signals.reload = lambda: db.run(self._reload_quietly)
            address = self._bind(start)
            sync = self._sync = SyncService(node, address=address, discovery=start.running.discovery,
                                            interval_s=start.running.interval_s, fanout=start.running.fanout,
                                            peers=start.running.peers, run=db.run, events=bus)
            self._serving.enter_context(node.serving(Network(OnServeLoop(loop, db), events=bus, lan=sync,
                                                             daemon=sync, config=LiveConfig(start, sync))))
            # The indexes a first turn searches (the agents' own databases and the banks they
            # auto-recall, bounded) are built on the search threads, so the first turns do not
            # wait for them on the database thread (auto-recall names a store whose index is
            # still building); every other bank's is built on its first use, within the memory
            # budget (node/memory/open_views.py), so start-up does not grow with the banks hosted.
            await db.run(node.memory.warm)
            await self._serve_sync(sync, net_limits)
            channel = ControlChannel(node, db, self.info, registry=self.options.registry, status=sync.status)
            await self._serve_control(channel, ctl_limits)
            self.info["api"] = await start_api(node.home, self.bound.get("api"), channel.commands, self.runners,
                                               Live(bus, str(node.peer_key.public)), net_limits)
            self.bound.take("api")  # the API's site owns it now (or it was off)
            self._sync_started = True  # from here on stop() is owed, even if start() fails half-way
            await sync.start()
            # What `memmesh status` reports about this serve (read on the database thread).
            node.serve_info = {"sync": self.info["listen"], "api": self.info["api"], "address": address,
                               "discovery": sync.status()["discovery"], "started_mono": time.monotonic(),
                               "pid": os.getpid(), "api_flag": self.options.api_listen}
            write_info(node.home, self.info)
            event("ready", pid=os.getpid(), listen=self.info["listen"], discovery=start.running.discovery,
                  interval_s=start.running.interval_s, fanout=start.running.fanout)
            await signals.stop.wait()
            event("stopping", signal=signals.by, drain_s=DRAIN_S)
        finally:
            await self._stop(db, bus, watch)
            signals.remove()
            flusher.cancel()
            snapshots.cancel()
            event("stop", pid=os.getpid(), signal=signals.by)
        return Result({"pid": os.getpid(), "listen": self.info.get("listen"), "signal": signals.by}, "")

    # ------------------------------------------------------------------ starting
    def _limits(self) -> tuple[Limits, Limits]:
        """Connection limits (node/listeners.py): the network listeners' caps stay within what
        the descriptor limit leaves after a reserve, so the control socket always has some."""
        fds_each = reserve_fds(3)  # sync, API, control
        net = self.options.limits.within(fds_each)
        # The control socket: only the owner connects, so no per-source cap; its clients send each
        # request at once, so the same request timers hold, and a full listener closes its oldest
        # stalled connection rather than refuse the CLI (a stalled local script cannot lock it out).
        ctl = replace(net, per_source=None, per_listener=fds_each, evict_stalled=True)
        event("limits", head_timeout_s=net.head_timeout_s, body_timeout_s=net.body_timeout_s,
              keepalive_s=net.keepalive_s, per_listener=net.per_listener, per_source=net.per_source,
              control=fds_each)
        return net, ctl

    def _bind(self, start: StartConfig) -> str:
        """Bind every listener (nothing answers yet); the address peers are told."""
        running = start.running
        self.bound.add("sync", bind_listen(running.listen))
        sync_sock = self.bound.get("sync")
        assert sync_sock is not None
        host, port = host_port(sync_sock)
        sock_path = (self.node.home / SERVE_SOCK).absolute()
        self.bound.add("control", bind_control_socket(sock_path))
        self.bound.add("api", bind_api(start.api, self.options.api_listen))  # the api section as serve started
        if running.advertise is None and host in WILDCARD_HOSTS:
            raise ServeError(f"serve: listening on {host} needs --advertise http:HOST:PORT (the address peers "
                             "and tickets should use)")
        address = running.advertise or f"http:{host}:{port}"
        self.info.update(pid=os.getpid(), home=str(self.node.home.absolute()), listen=f"{host}:{port}",
                         address=address, control=str(sock_path), node_key=str(self.node.peer_key.public),
                         started=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
        return address

    async def _site(self, app: web.Application, name: str, limits: Limits) -> None:
        """Serve ``app`` on the socket bound as ``name``, which the site owns once it started; its
        runner drains with the others on the way out."""
        sock = self.bound.get(name)
        assert sock is not None
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=DRAIN_S, keepalive_timeout=limits.keepalive_s)
        await runner.setup()
        self.runners.append(runner)
        await GuardedSite(runner, sock, limits, name).start()
        self.bound.take(name)

    async def _serve_sync(self, sync: SyncService, limits: Limits) -> None:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[access_log])
        sync.add_routes(app)
        await self._site(app, "sync", limits)
        listen = self.info["listen"]
        event("listening", address=listen, sync=f"http://{listen}/sync/v1/")

    async def _serve_control(self, channel: ControlChannel, limits: Limits) -> None:
        await self._site(channel.app(), "control", limits)
        event("control.listening", socket=self.info["control"], mode="0600")

    def _reload_quietly(self) -> None:
        """SIGHUP: what `memmesh reload` does, on the database thread."""
        with contextlib.suppress(MemmeshError):  # reload_config logged the outcome either way
            reload_config(self.node)

    # ------------------------------------------------------------------ stopping
    async def _stop(self, db: DbThread, bus: EventBus, watch: DatabaseWatch) -> None:
        home = self.node.home
        with contextlib.suppress(FileNotFoundError):
            (home / SERVE_JSON).unlink()  # first: new commands stop coming here
        if self._sync is not None and self._sync_started:
            try:
                await self._sync.stop()
            except Exception:
                event("sync.stop", logging.ERROR, exc_info=True)
        bus.close()  # event streams end now rather than hold the drain below for DRAIN_S
        # Stop listening; in-flight requests and control commands get DRAIN_S to finish.
        for r in reversed(self.runners):
            await r.cleanup()
        self.bound.close()
        await db.run(watch.stop)
        await asyncio.get_running_loop().run_in_executor(None, db.stop)  # after the queue drains
        self._serving.close()  # back to offline: nothing points at this loop any more
        with contextlib.suppress(FileNotFoundError):
            (home / SERVE_SOCK).unlink()


async def _save_snapshots_every(node: Node, every_s: float) -> None:
    """Now and then, the snapshots of views that grew (a kill -9 then costs the rows since the
    last one, applied on opening, not a rebuild). On a worker thread: a view's own lock is all
    it takes, the database thread goes on; closing the node writes the rest."""
    while True:
        await asyncio.sleep(every_s)
        try:
            written = await asyncio.to_thread(node.memory.save_snapshots)
        except Exception:
            event("snapshots", logging.ERROR, exc_info=True)
        else:
            if written:
                event("snapshots", written=written)


def _remove_stale(home: Path) -> None:
    stale = read_info(home)
    if stale is not None or (home / SERVE_SOCK).exists():
        # We hold the home's lock, so no other serve runs: these are a dead serve's files.
        event("stale", logging.WARNING, pid=(stale or {}).get("pid", "?"), note="removed a dead serve's files")
        remove_files(home)


# ---------------------------------------------------------------------- the HTTP API
def bind_api(spec: ApiSpec, flag: str | None) -> socket.socket | None:
    """The local HTTP API's listening socket (node/api/address.py says where), None when off."""
    listen = resolve_api_listen(flag, spec)
    if listen is None:
        return None
    try:
        return bind_listen(listen)
    except ServeError as exc:
        raise ServeError(f"{exc} (the HTTP API: choose another address with --api-listen HOST:PORT, or off)") from None


async def start_api(home: Path, sock: socket.socket | None, commands: CommandRunner,
                    runners: list[web.AppRunner], live: Live | None = None, limits: Limits | None = None) -> str | None:
    """Serve the local HTTP API on ``sock`` (its runner joins ``runners``, so it drains on the way
    out like the others); its HOST:PORT, None when it is off. ``live``: the event bus it streams;
    ``limits``: its connection limits (node/listeners.py)."""
    if sock is None:
        return None
    limits = limits or Limits()
    runner = web.AppRunner(build_app(commands.run, ensure_token(home), live=live), access_log=None,
                           shutdown_timeout=DRAIN_S, keepalive_timeout=limits.keepalive_s)
    await runner.setup()
    runners.append(runner)
    host, port = host_port(sock)
    await GuardedSite(runner, sock, limits, "api").start()
    event("api.listening", address=f"{host}:{port}", openapi=f"http://{host}:{port}/v1/openapi.json")
    return f"{host}:{port}"


# ---------------------------------------------------------------------- serve.json
def write_info(home: Path, info: dict[str, Any]) -> None:
    """serve.json, mode 0600, replaced atomically (a reader sees all of it or nothing)."""
    tmp = home / f".{SERVE_JSON}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f, indent=2, sort_keys=True)
        f.write("\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, home / SERVE_JSON)
