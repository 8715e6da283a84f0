"""Iterate a slow source on a second thread, a bounded distance ahead of its reader; map a
function over items on worker threads, in order, a bounded distance ahead.

Opening a database reads every stored payload (SQLite copies it out of the file) and hashes
it; both release the GIL for most of their work, so reading the next page while this one is
hashed overlaps the two on a second core. The reader sees the same items in the same order, and
any exception the source raises, at the point it would have seen it.
"""
from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice
from typing import TypeVar, cast

T = TypeVar("T")
U = TypeVar("U")

_DONE = object()
_POLL_S = 0.1  # how often a blocked producer looks whether its reader went away


def prefetched(source: Iterable[T], depth: int = 64) -> Generator[T, None, None]:
    """``source``'s items, produced on another thread at most ``depth`` ahead. Close it (or
    read it to the end) to stop the thread."""
    q: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in source:
                if not put(item):
                    return
        except BaseException as exc:  # handed to the reader, raised there
            put(_Raised(exc))
            return
        put(_DONE)

    worker = threading.Thread(target=produce, name="memmesh-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, _Raised):
                raise item.exc
            yield cast(T, item)
    finally:
        stop.set()  # the reader stopped (done, raised, or dropped the iterator)
        worker.join()


class _Raised:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def mapped_ahead(fn: Callable[[T], U], items: Iterable[T], *, workers: int = 2, depth: int = 8,
                 chunk: int = 64) -> Generator[U, None, None]:
    """``fn(item)`` for each item, in order, computed by ``workers`` threads on chunks of
    ``chunk`` items (a future per item would cost more than hashing a small entry), at most
    ``depth`` chunks ahead of the reader (for work that lets go of the GIL: hashing large
    payloads). An exception ``fn`` raises is raised to the reader at its item. Close it (or read
    it to the end) to stop the threads."""

    def run(batch: list[T]) -> tuple[list[U], BaseException | None]:
        done: list[U] = []
        try:
            for item in batch:
                done.append(fn(item))  # noqa: PERF401 (what came before an error is kept)
        except Exception as exc:  # the reader raises it after the items before it
            return done, exc
        return done, None

    pending: deque[Future[tuple[list[U], BaseException | None]]] = deque()
    it = iter(items)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="memmesh-ahead") as pool:
        try:
            while batch := list(islice(it, chunk)):
                pending.append(pool.submit(run, batch))
                while len(pending) >= depth or (pending and pending[0].done()):
                    yield from _unpacked(pending.popleft())
            while pending:
                yield from _unpacked(pending.popleft())
        finally:
            for f in pending:
                f.cancel()
            close = getattr(it, "close", None)
            if close is not None:  # a generator source (prefetched) stops its own thread
                close()


def _unpacked(future: Future[tuple[list[U], BaseException | None]]) -> Iterator[U]:
    done, exc = future.result()
    yield from done
    if exc is not None:
        raise exc
