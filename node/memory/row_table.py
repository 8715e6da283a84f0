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

from .rows import Edge, Memory

__all__ = ["RowTable"]

Order = tuple[int, str, int]
_PREFIX = "sha256:"
_GROW = 64


def _digest(entry_id: str) -> bytes:
    if not entry_id.startswith(_PREFIX) or len(entry_id) != len(_PREFIX) + 64:
        raise ValueError(f"not an entry id: {entry_id!r}")
    return bytes.fromhex(entry_id[len(_PREFIX):])


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
        self._height = np.zeros(_GROW, dtype=np.int64)
        self._clock = np.zeros(_GROW, dtype=np.int64)
        self._digest = np.zeros((_GROW, 32), dtype=np.uint8)
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
        return Memory(key, value, tags, ts, author, _PREFIX + self._digest[doc].tobytes().hex(), row_key,
                      self.order(doc), category, confidence, importance, entities,
                      tuple(Edge(t, to, entry) for t, to, entry in edges), valid_from, valid_to, source)

    def __iter__(self) -> Iterator[Memory]:
        return (self[doc] for doc in range(self._n))

    def order(self, doc: int) -> Order:
        """The doc's T order, as its row's ``order``."""
        return (int(self._height[doc]), _PREFIX + self._digest[doc].tobytes().hex(), int(self._clock[doc]))

    def desc_key(self, doc: int) -> tuple[int, int, int]:
        """``order_desc_key(self.order(doc))``, without making the id's text."""
        return (-int(self._height[doc]), -int.from_bytes(self._digest[doc].tobytes(), "big"), -int(self._clock[doc]))

    def t_rank(self) -> np.ndarray:
        """Every doc's rank in T order (0 the oldest), in one sort."""
        n = self._n
        words = self._digest[:n].view(">u8")  # four big-endian words per digest: their order is the bytes'
        by = np.lexsort((self._clock[:n], words[:, 3], words[:, 2], words[:, 1], words[:, 0], self._height[:n]))
        rank = np.empty(n, dtype=np.int64)
        rank[by] = np.arange(n, dtype=np.int64)
        return rank

    # ------------------------------------------------------------------ adding
    def _reserve(self, need: int) -> None:
        cap = len(self._height)
        if need <= cap:
            return
        cap = max(need, cap + cap // 2)
        for name in ("_height", "_clock", "_digest"):
            old = getattr(self, name)
            grown = np.zeros((cap, *old.shape[1:]), dtype=old.dtype)
            grown[: self._n] = old[: self._n]
            setattr(self, name, grown)

    def append(self, m: Memory) -> None:
        self.extend((m,))

    def extend(self, mems: Iterable[Memory]) -> None:
        mems = list(mems)
        first, end = self._n, self._n + len(mems)
        self._reserve(end)
        self._height[first:end] = [m.order[0] for m in mems]
        self._clock[first:end] = [m.order[2] for m in mems]
        if mems:
            self._digest[first:end] = np.frombuffer(b"".join(_digest(m.order[1]) for m in mems),
                                                    dtype=np.uint8).reshape(-1, 32)
        self._tail.extend(mems)
        self._n = end

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
        return sum(a.nbytes for a in (self._height, self._clock, self._digest, self._blob, self._offsets))

    def __getstate__(self) -> dict[str, Any]:
        self.pack()  # a pickle (a view snapshot) holds columns only
        return {k: v for k, v in self.__dict__.items() if k != "desc_keys"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.desc_keys = DescKeys(self)
