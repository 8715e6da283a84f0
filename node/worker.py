"""Where a node's database work runs, and how commands that need the network do it.

Databases are not thread-safe and their calls are CPU-bound (validation, SQLite), so under
``memmesh serve`` one thread, the database thread, runs every call that touches them, in
order, while the asyncio loop moves bytes. Coroutines hand work to it with ``await run(fn)``.

A command handler is a plain function (the registry runs it on the database thread under
``serve``, or in the CLI's own process). A handler that needs the network (import, sync) calls
``node.network.run(make)`` with ``make(run) -> coroutine``: in a one-shot process the coroutine
runs in a fresh event loop and ``run(fn)`` calls ``fn`` in place; under ``serve`` it runs on
the serve loop while the database thread keeps executing the database calls that coroutine
(and everyone else) hands it, so waiting for a peer never blocks the node.

``Network`` is built from typed parts (an Executor, an EventPublisher, a PeerDiscovery, a
SyncTrigger, a Reconfigurer): serve passes its own when it builds the node's network for its
run; a node that does not serve has the offline ones.
"""
from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from memmesh.node.settings import NodeConfig

T = TypeVar("T")
Runner = Callable[[Callable[[], T]], Awaitable[T]]


async def run_here(fn: Callable[[], T]) -> T:
    """The runner of a one-shot process: the caller already owns the databases."""
    return fn()


class DbThread:
    """One thread that runs every database call of a serving node, in order."""

    def __init__(self, name: str = "memmesh-db") -> None:
        self._tasks: queue.SimpleQueue[tuple[Callable[[], Any], Future] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            item = self._tasks.get()
            if item is None:
                return
            self._execute(item)

    @staticmethod
    def _execute(item: tuple[Callable[[], Any], Future]) -> None:
        fn, fut = item
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(fn())
        except BaseException as exc:  # handed back to whoever waits for it
            fut.set_exception(exc)

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        fut: Future[T] = Future()
        if self.on_thread():  # already here: run now, in order with the caller
            self._execute((fn, fut))
        else:
            self._tasks.put((fn, fut))
        return fut

    async def run(self, fn: Callable[[], T]) -> T:
        return await asyncio.wrap_future(self.submit(fn))

    def wait(self, fut: Future[T], timeout: float | None = None) -> T:
        """Wait for ``fut`` on the database thread, running the database calls queued meanwhile
        (the coroutine being waited for hands them here)."""
        if not self.on_thread():
            return fut.result(timeout)
        while not fut.done():
            try:
                item = self._tasks.get(timeout=0.05)
            except queue.Empty:
                continue
            if item is None:
                self._tasks.put(None)  # stop after the wait
                break
            self._execute(item)
        return fut.result(0)

    def stop(self) -> None:
        self._tasks.put(None)
        if not self.on_thread():
            self._thread.join(timeout=30)


# ---------------------------------------------------------------------- what a node reaches
# The parts below are handed to a Network when it is built: serve builds one from its
# database thread, event bus, sync daemon and live config (node/server.py); every other node
# (the library, a one-shot command) has the offline parts, which run in place and tell nobody.
class Executor(Protocol):
    """Where database calls and network coroutines run."""

    @property
    def serving(self) -> bool: ...

    def runner(self) -> Runner: ...

    def run(self, make: Callable[[Runner], Coroutine[Any, Any, T]], timeout: float | None = None) -> T: ...


class EventPublisher(Protocol):
    """serve's live event stream (node/events.py): publish(type, data) from any thread."""

    def publish(self, type_: str, data: dict[str, Any]) -> object: ...


class PeerDiscovery(Protocol):
    """What LAN discovery knows: the addresses announced for a key, and the peers seen."""

    def lookup(self, key: str) -> list[str]: ...

    def discovered(self) -> list[dict[str, Any]]: ...


class SyncTrigger(Protocol):
    """The sync daemon: "sync this database soon" (from any thread)."""

    def poke(self, db_id: str) -> None: ...


class Reconfigurer(Protocol):
    """The running serve's side of a config just applied (node/config_apply.py): it takes what
    can change live and returns, for people, what needs a restart of serve instead."""

    def reconfigure(self, cfg: NodeConfig) -> list[str]: ...


class InPlace:
    """The executor of a one-shot process: the caller already owns the databases, and a network
    coroutine runs in a fresh event loop."""

    serving = False

    def runner(self) -> Runner:
        return run_here

    def run(self, make: Callable[[Runner], Coroutine[Any, Any, T]], timeout: float | None = None) -> T:
        return asyncio.run(make(run_here))


@dataclass(frozen=True)
class OnServeLoop:
    """serve's executor: coroutines run on its loop, database calls on its database thread."""

    loop: asyncio.AbstractEventLoop
    db: DbThread
    serving = True

    def runner(self) -> Runner:
        return self.db.run

    def run(self, make: Callable[[Runner], Coroutine[Any, Any, T]], timeout: float | None = None) -> T:
        fut = asyncio.run_coroutine_threadsafe(make(self.db.run), self.loop)
        return self.db.wait(fut, timeout)


class Offline:
    """Nobody listens to a node that does not serve: no events, no LAN, no daemon, no live
    config. Implements EventPublisher, PeerDiscovery, SyncTrigger and Reconfigurer."""

    def publish(self, type_: str, data: dict[str, Any]) -> None:
        return None

    def lookup(self, key: str) -> list[str]:
        return []

    def discovered(self) -> list[dict[str, Any]]:
        return []

    def poke(self, db_id: str) -> None:
        return None

    def reconfigure(self, cfg: NodeConfig) -> list[str]:
        return []


OFFLINE = Offline()


@dataclass(frozen=True)
class Network:
    """How a command reaches the network (see the module docstring): built from its parts, never
    changed; a node that starts serving is handed a whole new one (library.Node.serving)."""

    executor: Executor = field(default_factory=InPlace)
    events: EventPublisher = OFFLINE
    lan: PeerDiscovery = OFFLINE
    daemon: SyncTrigger = OFFLINE
    config: Reconfigurer = OFFLINE

    @property
    def serving(self) -> bool:
        return self.executor.serving

    def runner(self) -> Runner:
        return self.executor.runner()

    def run(self, make: Callable[[Runner], Coroutine[Any, Any, T]], timeout: float | None = None) -> T:
        return self.executor.run(make, timeout)

    def publish(self, type_: str, data: dict[str, Any]) -> None:
        self.events.publish(type_, data)

    def lookup(self, key: str) -> list[str]:
        return self.lan.lookup(key)

    def discovered(self) -> list[dict[str, Any]]:
        return self.lan.discovered()

    def poke(self, db_id: str) -> None:
        self.daemon.poke(db_id)

    def reconfigure(self, cfg: NodeConfig) -> list[str]:
        return self.config.reconfigure(cfg)
