"""Iterate a slow source on a second thread, a bounded distance ahead of its reader.

Opening a database reads every stored payload (SQLite copies it out of the file) and hashes
it; both release the GIL for most of their work, so reading the next page while this one is
hashed overlaps the two on a second core. The reader sees the same items in the same order, and
any exception the source raises, at the point it would have seen it.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterable
from typing import TypeVar, cast

T = TypeVar("T")

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
