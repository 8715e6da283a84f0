"""The rows of a memory view, doc by doc, kept as columns: a :class:`Memory` is made when a doc
is read, not kept per row.

A view reads a row's fields for its results (at most a page of them), for the few rows a lookup
names, and for listings; what it needs for every row is only the row's T order (the
deterministic tie-break of every ranking, and the order of each key's timeline). So:

* the T order of every doc is three columns: height, the entry's SHA-256 digest (32 bytes; ids
  are ``sha256:<64 lowercase hex digits>``, so comparing digests is comparing ids) and clock;
  :meth:`RowTable.order`, :meth:`RowTable.desc_key` and :meth:`RowTable.t_rank` (every doc's
  rank in T order, vectorised) read them;
* the other fields of a row are one msgpack record in a byte column (``blob``, with
  ``offsets``), once packed (:meth:`RowTable.pack`, which a view snapshot does before it is
  written, node/memory/snapshot.py); rows added since are kept as the :class:`Memory` objects
  they arrived as, until the next packing.

Opened from a snapshot, both are arrays mapped from the file: no object per row is made, and
the bytes of a row are read only when the row is. Reading a packed row gives an equal
:class:`Memory` (same fields, same types), not the same object.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import msgpack
import numpy as np

from .order_columns import Order, OrderColumns
from .rows import Edge, Memory

__all__ = ["RowTable"]


def _record(m: Memory) -> tuple[Any, ...]:
    return (m.key, m.value, m.tags, m.ts, m.author, m.row_key, m.category, m.confidence, m.importance,
            m.entities, [(e.type, e.to, e.entry) for e in m.edges], m.valid_from, m.valid_to, m.source)


class DescKeys:
    """``keys[doc]``: the doc's :func:`node.memory.rows.order_desc_key` (newest first), read from
    the columns; what rankings break ties with."""

    __slots__ = ("_rows",)

    def __init__(self, rows: RowTable) -> None:
        self._rows = rows

    def __getitem__(self, doc: int) -> tuple[int, int, int]:
        return self._rows.desc_key(doc)


class RowTable(Sequence[Memory]):
    """doc -> its :class:`Memory`, rows kept as columns (the module docstring)."""

    def __init__(self) -> None:
        self._n = 0
        self._orders = OrderColumns()
        self._blob = np.zeros(0, dtype=np.uint8)  # the packed rows' records, one after another
        self._offsets = np.zeros(1, dtype=np.int64)  # record i is blob[offsets[i]:offsets[i + 1]]
        self._tail: list[Memory] = []  # the rows after the packed ones
        self.desc_keys = DescKeys(self)

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return self._n

    def __getitem__(self, doc: int) -> Memory:  # type: ignore[override]
        packed = len(self._offsets) - 1
        if doc < 0 or doc >= self._n:
            raise IndexError(doc)
        if doc >= packed:
            return self._tail[doc - packed]
        a, b = int(self._offsets[doc]), int(self._offsets[doc + 1])
        (key, value, tags, ts, author, row_key, category, confidence, importance, entities, edges, valid_from,
         valid_to, source) = msgpack.unpackb(self._blob[a:b], use_list=False, unicode_errors="surrogatepass")
        order = self.order(doc)
        return Memory(key, value, tags, ts, author, order[1], row_key, order, category, confidence, importance, entities,
                      tuple(Edge(t, to, entry) for t, to, entry in edges), valid_from, valid_to, source)

    def __iter__(self) -> Iterator[Memory]:
        return (self[doc] for doc in range(self._n))

    def order(self, doc: int) -> Order:
        """The doc's T order, as its row's ``order``."""
        order = self._orders.get(doc)
        assert order is not None
        return order

    def desc_key(self, doc: int) -> tuple[int, int, int]:
        """``order_desc_key(self.order(doc))``, without making the id's text."""
        return self._orders.desc_key(doc)

    def t_rank(self) -> np.ndarray:
        """Every doc's rank in T order (0 the oldest), in one sort."""
        return self._orders.t_rank(self._n)

    # ------------------------------------------------------------------ adding
    def append(self, m: Memory) -> None:
        self.extend((m,))

    def extend(self, mems: Iterable[Memory]) -> None:
        mems = list(mems)
        for m in mems:
            if m.entry_id != m.order[1]:  # the id is kept once, in the order's columns
                raise ValueError(f"row {m.row_key!r}: its entry {m.entry_id!r} is not its order's {m.order[1]!r}")
        self._orders.set_many(self._n, [m.order for m in mems])
        self._tail.extend(mems)
        self._n += len(mems)

    def pack(self) -> None:
        """Move the rows added since the last packing into the byte column."""
        if not self._tail:
            return
        packer = msgpack.Packer(unicode_errors="surrogatepass")
        records = [packer.pack(_record(m)) for m in self._tail]
        sizes = np.fromiter(map(len, records), dtype=np.int64, count=len(records))
        self._offsets = np.concatenate((self._offsets, self._offsets[-1] + np.cumsum(sizes)))
        self._blob = np.concatenate((self._blob, np.frombuffer(b"".join(records), dtype=np.uint8)))
        self._tail = []

    def nbytes(self) -> int:
        return self._orders.nbytes() + self._blob.nbytes + self._offsets.nbytes

    def __getstate__(self) -> dict[str, Any]:
        self.pack()  # a pickle (a view snapshot) holds columns only
        return {k: v for k, v in self.__dict__.items() if k != "desc_keys"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.desc_keys = DescKeys(self)
