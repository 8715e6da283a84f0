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
"""
from __future__ import annotations

import asyncio
import queue
import threading
from concurrent.futures import Future
from typing import Any, Awaitable, Callable, TypeVar

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

    def submit(self, fn: Callable[[], T]) -> "Future[T]":
        fut: Future = Future()
        if self.on_thread():  # already here: run now, in order with the caller
            self._execute((fn, fut))
        else:
            self._tasks.put((fn, fut))
        return fut

    async def run(self, fn: Callable[[], T]) -> T:
        return await asyncio.wrap_future(self.submit(fn))

    def wait(self, fut: "Future[T]", timeout: float | None = None) -> T:
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


class Network:
    """How a command reaches the network (see the module docstring)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None  # set by serve
        self.db: DbThread | None = None
        # Set by serve's sync service: addresses LAN discovery knows for a peer key, the peers
        # seen on the LAN, and "sync this database soon".
        self.lookup: Callable[[str], list[str]] = lambda key: []
        self.discovered: Callable[[], list[dict[str, Any]]] = lambda: []
        self.poke: Callable[[str], None] = lambda db_id: None
        # Set by serve: a config just applied (node/config_apply.py) takes effect in the running
        # serve; returns what needs a restart of serve instead.
        self.reconfigure: Callable[[Any], list[str]] = lambda cfg: []
        # Set by serve: publish(type, data) onto its live event stream (node/events.py), from
        # any thread; nobody listens to a one-shot command, so it does nothing then.
        self.publish: Callable[[str, dict[str, Any]], None] = lambda type_, data: None

    @property
    def serving(self) -> bool:
        return self.loop is not None

    def runner(self) -> Runner:
        return self.db.run if self.db is not None else run_here

    def run(self, make: Callable[[Runner], Awaitable[T]], timeout: float | None = None) -> T:
        if self.loop is None or self.db is None:
            return asyncio.run(make(run_here))
        fut = asyncio.run_coroutine_threadsafe(make(self.db.run), self.loop)
        return self.db.wait(fut, timeout)
