"""T orders by doc, as columns: ``(height, entry id, clock)`` (crdt RowRecord.order) kept as a
height, the entry's SHA-256 digest and a clock, so a million of them cost three arrays (mapped
from a view snapshot's file, node/memory/snapshot.py) rather than a million tuples.

Entry ids are ``sha256:<64 lowercase hex digits>`` (crdt.entry), so comparing digests as bytes
is comparing ids as text, and :meth:`OrderColumns.t_rank` orders every doc in one sort.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["OrderColumns", "entry_digest"]

Order = tuple[int, str, int]
PREFIX = "sha256:"
_ABSENT = -1  # heights are >= 0
_GROW = 64


def entry_digest(entry_id: str) -> bytes:
    """The 32 bytes an entry id spells; ValueError for anything that is not an entry id."""
    if not entry_id.startswith(PREFIX) or len(entry_id) != len(PREFIX) + 64:
        raise ValueError(f"not an entry id: {entry_id!r}")
    return bytes.fromhex(entry_id[len(PREFIX):])


class OrderColumns:
    """doc -> T order (or none), growable."""

    def __init__(self) -> None:
        self._height = np.full(_GROW, _ABSENT, dtype=np.int64)
        self._clock = np.zeros(_GROW, dtype=np.int64)
        self._digest = np.zeros((_GROW, 32), dtype=np.uint8)

    def _reserve(self, need: int) -> None:
        cap = len(self._height)
        if need <= cap:
            return
        cap = max(need, cap + cap // 2)
        for name, fill in (("_height", _ABSENT), ("_clock", 0), ("_digest", 0)):
            old = getattr(self, name)
            grown = np.full((cap, *old.shape[1:]), fill, dtype=old.dtype)
            grown[: len(old)] = old
            setattr(self, name, grown)

    def set(self, doc: int, order: Order) -> None:
        self.set_many(doc, (order,))

    def set_many(self, first: int, orders: Sequence[Order]) -> None:
        """The orders of docs ``first, first + 1, ...``."""
        end = first + len(orders)
        self._reserve(end)
        if not orders:
            return
        self._height[first:end] = [o[0] for o in orders]
        self._clock[first:end] = [o[2] for o in orders]
        self._digest[first:end] = np.frombuffer(b"".join(entry_digest(o[1]) for o in orders),
                                                dtype=np.uint8).reshape(-1, 32)

    def scatter(self, docs: Sequence[int], orders: Sequence[Order]) -> None:
        """The orders of ``docs`` (any docs, in any order)."""
        if not docs:
            return
        self._reserve(max(docs) + 1)
        at = np.asarray(docs, dtype=np.int64)
        self._height[at] = [o[0] for o in orders]
        self._clock[at] = [o[2] for o in orders]
        self._digest[at] = np.frombuffer(b"".join(entry_digest(o[1]) for o in orders), dtype=np.uint8).reshape(-1, 32)

    def __contains__(self, doc: int) -> bool:
        return 0 <= doc < len(self._height) and self._height[doc] != _ABSENT

    def get(self, doc: int) -> Order | None:
        if doc not in self:
            return None
        return (int(self._height[doc]), PREFIX + self._digest[doc].tobytes().hex(), int(self._clock[doc]))

    def entry_id(self, doc: int) -> str:
        return PREFIX + self._digest[doc].tobytes().hex()

    def desc_key(self, doc: int) -> tuple[int, int, int]:
        """``rows.order_desc_key`` of the doc's order, without making the id's text."""
        return (-int(self._height[doc]), -int.from_bytes(self._digest[doc].tobytes(), "big"), -int(self._clock[doc]))

    def t_rank(self, n: int) -> np.ndarray:
        """The rank in T order (0 the oldest) of docs 0..n-1, which all have an order."""
        words = self._digest[:n].view(">u8")  # four big-endian words per digest: their order is the bytes'
        by = np.lexsort((self._clock[:n], words[:, 3], words[:, 2], words[:, 1], words[:, 0], self._height[:n]))
        rank = np.empty(n, dtype=np.int64)
        rank[by] = np.arange(n, dtype=np.int64)
        return rank

    def nbytes(self) -> int:
        return self._height.nbytes + self._clock.nbytes + self._digest.nbytes
