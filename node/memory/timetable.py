"""Every key's timeline as flat arrays: ``as_of`` and ``as_known_at`` as vectorised group maxima.

The rules are those of :mod:`node.memory.timeline`, for all keys at once. A key's timeline is its
rows and its *tombstones* (rows of other keys whose ``supersedes`` edges name it). Here each
(key, row) pair is one *item*; the items are kept grouped by key and, within a group, in T order
(oldest first), as three arrays: the key's id, the doc of the row, whether it is a tombstone.

* **Held at world time t** (:meth:`TimeTable.held`, :func:`timeline.held_at`): per group, the
  newest item in force at t (``valid_from`` absent or <= t) decides: a row holds when t is before
  its ``valid_to``, a tombstone means nothing held.
* **Current** (:meth:`TimeTable.current`, :func:`timeline.current_in`): per group, the newest
  item decides: a row is current, a tombstone means nothing is.

Both may be restricted to the items of an entry's causal past (a boolean array over items, from
one over docs: :meth:`TimeTable.known`). "The newest qualifying item of each group" is the
qualifying item not followed by another of its group, so a question costs a few vectorised
passes over the items, not a Python loop over keys (``np.maximum.reduceat`` over the groups
was measured 4x slower).

Keeping the order. New items (a remembered row, rows received from a peer) are queued and
merged on the next question: each queued item's place is found by binary search (its key's
group by id, then T order within the group, compared on the rows' ``order``), and all are
inserted with one ``np.insert`` (O(items) copying, well under a millisecond at 170k). A very
large queue (a bulk receive) is merged by sorting everything again instead. A bulk load (a
view's rebuild) numbers docs in T order, so one ``np.lexsort`` orders the items.
"""
from __future__ import annotations

import numpy as np

from .columns import DocColumns
from .row_table import RowTable
from .timeline import _i64

__all__ = ["TimeTable"]


_EMPTY = np.empty(0, dtype=np.int64)
_RESORT_MIN = 2048  # a queue longer than this and than an eighth of the table: sort it all


class TimeTable:
    """The timelines of a view's keys (see the module docstring); keys are small ints."""

    def __init__(self, cols: DocColumns, rows: RowTable) -> None:
        self._cols = cols
        self._rows = rows  # doc -> T order of its row
        self.key = _EMPTY
        self.doc = _EMPTY
        self.tomb = np.empty(0, dtype=bool)
        self._queue: list[tuple[int, int, bool]] = []
        self._derive()

    def __len__(self) -> int:
        self._merge()
        return len(self.key)

    def load(self, keys: np.ndarray, docs: np.ndarray, tombs: np.ndarray) -> None:
        """Replace the items, given in any order, with docs numbered in T order."""
        order = np.lexsort((docs, keys))
        self.key, self.doc, self.tomb = keys[order], docs[order], tombs[order]
        self._queue = []
        self._derive()

    def add(self, key: int, doc: int, tomb: bool) -> None:
        self._queue.append((key, doc, tomb))

    # ------------------------------------------------------------------ questions
    def known(self, doc_mask: np.ndarray) -> np.ndarray:
        """The items whose rows are in ``doc_mask`` (a boolean array over docs)."""
        self._merge()
        return doc_mask[self.doc]

    def group(self, key: int) -> list[int]:
        """The docs of a key's items (its rows and tombstones), oldest first in T order."""
        self._merge()
        lo, hi = np.searchsorted(self.key, [key, key + 1]).tolist()
        return self.doc[lo:hi].tolist()

    def held(self, t: int, known: np.ndarray | None = None) -> np.ndarray:
        """Docs of the rows that held at world time ``t``, one per key at most."""
        self._merge()
        if not len(self.key):
            return _EMPTY
        t = _i64(t)
        ok = self._vf <= t
        if known is not None:
            ok &= known
        win = self._winners(ok)
        return self.doc[win[self._vt[win] > t]]

    def current(self, known: np.ndarray) -> np.ndarray:
        """Docs of the current rows among the ``known`` items, one per key."""
        self._merge()
        if not len(self.key):
            return _EMPTY
        return self.doc[self._winners(known)]

    def _winners(self, ok: np.ndarray) -> np.ndarray:
        """Per group, the position of its newest ``ok`` item, when that item is a row."""
        # Groups are contiguous and in T order: the newest ok item of a group is the ok item
        # followed by no ok item of the same group.
        at = np.flatnonzero(ok)
        if not len(at):
            return at
        group = self.key[at]
        last = np.empty(len(at), dtype=bool)
        np.not_equal(group[1:], group[:-1], out=last[:-1])
        last[-1] = True
        at = at[last]
        return at[~self.tomb[at]]

    # ------------------------------------------------------------------ upkeep
    def _derive(self) -> None:
        self._vf = self._cols.valid_from[self.doc]
        self._vt = self._cols.valid_to[self.doc]

    def _merge(self) -> None:
        if not self._queue:
            return
        queue, self._queue = self._queue, []
        order_of = self._rows.order
        if self._should_resort(len(queue)):
            self._resort(queue)
            return
        queue.sort(key=lambda item: (item[0], order_of(item[1])))
        keys = np.fromiter((item[0] for item in queue), dtype=np.int64, count=len(queue))
        lows = np.searchsorted(self.key, keys, side="left").tolist()
        highs = np.searchsorted(self.key, keys, side="right").tolist()
        docs = self.doc
        places = []
        for (_key, doc, _tomb), lo, hi in zip(queue, lows, highs):
            o = order_of(doc)
            while lo < hi:  # groups are short: a binary search by T order within the group
                mid = (lo + hi) // 2
                if order_of(int(docs[mid])) < o:
                    lo = mid + 1
                else:
                    hi = mid
            places.append(lo)
        # np.insert keeps items given for the same place in the order given (T order).
        self.key = np.insert(self.key, places, keys)
        self.doc = np.insert(self.doc, places, [item[1] for item in queue])
        self.tomb = np.insert(self.tomb, places, [item[2] for item in queue])
        self._derive()

    def _should_resort(self, queued: int) -> bool:
        return queued > _RESORT_MIN and 8 * queued > len(self.key)

    def _resort(self, queue: list[tuple[int, int, bool]]) -> None:
        keys = np.concatenate((self.key, np.fromiter((i[0] for i in queue), dtype=np.int64, count=len(queue))))
        docs = np.concatenate((self.doc, np.fromiter((i[1] for i in queue), dtype=np.int64, count=len(queue))))
        tombs = np.concatenate((self.tomb, np.fromiter((i[2] for i in queue), dtype=bool, count=len(queue))))
        rank = self._rows.t_rank()
        order = np.lexsort((rank[docs], keys))
        self.key, self.doc, self.tomb = keys[order], docs[order], tombs[order]
        self._derive()

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.key, self.doc, self.tomb, self._vf, self._vt))
