"""The memory views a memory service keeps open, within a byte budget (docs/operations.md,
"Memory budget").

A view (node/memory/view.py) holds a bank's recall index in memory: numpy arrays and Python
objects per row. A node hosting a thousand banks cannot keep every index built, so views are
kept least recently used first and, when their estimated bytes pass the budget, the least
recently used idle ones are closed: unsubscribed from their database and forgotten (a large
one due a snapshot writes it first, on a thread of its own: node/memory/snapshot.py). The next
use opens the bank's view again, from its snapshot or the database, and it answers exactly as
the closed one would have (a view is a function of the database's rows).

Never closed:
* a view some caller is using: one whose lock another thread holds (a search), or one the
  service names busy (an auto-recall search submitted for it and not finished);
* the ``KEEP_RECENT`` most recently used views, so a call that uses a few views at once (an
  auto-recall over its banks, a neighbours walk) never loses one it holds between two uses;
  the budget may be passed by those.

The estimate of a view: the bytes of its arrays (``MemoryView.footprint``, cheap: it is taken at every use) and
``PY_BYTES_PER_ROW`` per row for the Python objects (each row's Memory, its entries in the
per-key maps, the token lists): measured with tracemalloc over banks of 1,000 short memories
(bench/scale_banks.py's rows), about 1,550 bytes per row beside about 340 of arrays.

Bookkeeping runs on the thread that asks for views (serve's database thread); a search thread
may record the size of a view it just built, so the maps are guarded by a lock.
"""
from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from memmesh.node.memory.heap import release_freed_memory
from memmesh.node.memory.view import MemoryView

log = logging.getLogger(__name__)

PY_BYTES_PER_ROW = 1600
DEFAULT_SHARE = 0.25  # of the machine's physical memory, when the config sets no budget
FALLBACK_BYTES = 1 << 30  # when the system does not say how much memory it has
KEEP_RECENT = 8


def physical_bytes() -> int | None:
    """The machine's physical memory (None when the system does not say)."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def default_budget_bytes() -> int:
    """DEFAULT_SHARE of physical memory (1 GiB where the system does not say)."""
    phys = physical_bytes()
    return int(phys * DEFAULT_SHARE) if phys is not None else FALLBACK_BYTES


def budget_bytes(mib: float | None) -> int:
    """The budget for a configured ``memory.view_budget_mib`` (None: the default)."""
    return default_budget_bytes() if mib is None else int(mib * 2**20)


def estimated_bytes(rows: int, arrays: int) -> int:
    """A built view's estimated bytes from its ``footprint()``: its arrays and its rows' objects."""
    return arrays + rows * PY_BYTES_PER_ROW


@dataclass(frozen=True)
class ViewStats:
    open: int  # views open (built or not)
    built: int  # views whose index is built (measured)
    bytes: int  # their estimated bytes
    budget: int
    closed: int  # views closed under the budget since the service started


def _save_and_close(view: MemoryView) -> None:
    try:
        view.save_snapshot()
    except OSError as exc:
        log.warning("could not write the view snapshot of %s (%s); its next use rebuilds it from the log",
                    view.db.id, exc)
    finally:
        view.close()
        release_freed_memory()


class OpenViews:
    """Views by database id, least recently used first, trimmed to a budget."""

    def __init__(self, budget: Callable[[], int], busy: Callable[[str], bool] = lambda _db_id: False,
                 keep_recent: int = KEEP_RECENT) -> None:
        """``budget``: the bytes views may take (asked at each trim: a reload changes it);
        ``busy(db_id)``: whether a caller is using that database's view now."""
        self._budget = budget
        self._busy = busy
        self.keep_recent = keep_recent
        self._views: OrderedDict[str, MemoryView] = OrderedDict()
        self._bytes: dict[str, int] = {}  # db id -> estimated bytes, for built views
        self._lock = threading.Lock()
        self.closed = 0

    def __contains__(self, db_id: str) -> bool:
        return db_id in self._views

    def __len__(self) -> int:
        return len(self._views)

    def ids(self) -> list[str]:
        """Least recently used first."""
        with self._lock:
            return list(self._views)

    def values(self) -> list[MemoryView]:
        """The open views, least recently used first (a copy: safe to walk from any thread)."""
        with self._lock:
            return list(self._views.values())

    def peek(self, db_id: str) -> MemoryView | None:
        """The open view of ``db_id``, not counted as a use."""
        return self._views.get(db_id)

    def use(self, db_id: str) -> MemoryView | None:
        """The open view of ``db_id`` (None: none), now the most recently used."""
        with self._lock:
            view = self._views.get(db_id)
            if view is not None:
                self._views.move_to_end(db_id)
        if view is not None and self.measure(db_id, view):
            self.trim()
        return view

    def add(self, db_id: str, view: MemoryView) -> None:
        """A view just opened (the most recently used), then trim to the budget."""
        with self._lock:
            old = self._views.pop(db_id, None)
            self._views[db_id] = view
        if old is not None and old is not view:
            old.close()
        self.measure(db_id, view)
        self.trim()

    def measure(self, db_id: str, view: MemoryView) -> bool:
        """Record the view's estimated bytes if it is built and no one holds it (never waits,
        never builds); whether the estimate changed."""
        with view.held(0) as got:
            if not got or not view.loaded:
                return False
            est = estimated_bytes(*view.footprint())
        with self._lock:
            if self._views.get(db_id) is not view or self._bytes.get(db_id) == est:
                return False
            self._bytes[db_id] = est
        return True

    def total(self) -> int:
        with self._lock:
            return sum(self._bytes.values())

    def trim(self) -> list[str]:
        """Close least recently used idle views until the estimate is within the budget; the
        database ids of the views closed."""
        budget = self._budget()
        with self._lock:
            total = sum(self._bytes.values())
            if total <= budget:
                return []
            order = list(self._views)[:max(0, len(self._views) - self.keep_recent)]
        closed = []
        for db_id in order:
            if total <= budget:
                break
            est = self._bytes.get(db_id)
            if not est or self._busy(db_id):  # not built: it holds next to nothing
                continue
            view = self._views.get(db_id)
            if view is None:
                continue
            with view.held(0) as got:
                if not got:  # a search holds it
                    continue
                with self._lock:
                    if self._views.get(db_id) is not view:
                        continue
                    del self._views[db_id]
                    self._bytes.pop(db_id, None)
                due = view.snapshot_due
            if due:
                # Built and not on disk: keep it there before it goes, so that its next use
                # reads it back instead of rebuilding it. Not on this thread (the database
                # thread): writes reaching it meanwhile wait in its queue, as in any snapshot.
                threading.Thread(target=_save_and_close, args=(view,), name="memmesh-snapshot").start()
            else:
                view.close()
            total -= est
            closed.append(db_id)
        view = None  # the last closed view goes with it, before its memory is given back
        if closed:
            release_freed_memory()  # what the closed views held, back to the system where it can be
            self.closed += len(closed)
            log.debug("closed %d memory views over the budget (%d bytes): %s", len(closed), budget,
                      ", ".join(i[:15] for i in closed))
        return closed

    def pop(self, db_id: str) -> MemoryView | None:
        with self._lock:
            self._bytes.pop(db_id, None)
            return self._views.pop(db_id, None)

    def close_all(self) -> None:
        with self._lock:
            views = list(self._views.values())
            self._views.clear()
            self._bytes.clear()
        for view in views:
            view.close()

    def stats(self) -> ViewStats:
        budget = self._budget()
        with self._lock:
            return ViewStats(len(self._views), len(self._bytes), sum(self._bytes.values()), budget, self.closed)
