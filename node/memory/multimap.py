"""int -> docs, kept as two sorted arrays plus a small dict of what was added since: a view's
lookups by a hash (remember's same-text check, node/memory/dedup.py) without a Python list per
key, and a view snapshot (node/memory/snapshot.py) maps the arrays from its file.
"""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["IntMultiMap"]

_EMPTY = np.empty(0, dtype=np.int64)


class IntMultiMap:
    """``get(key)``: the values added under ``key``, in the order they were added."""

    def __init__(self) -> None:
        self._keys = _EMPTY  # sorted; a key's values are a run, in the order added
        self._values = _EMPTY
        self._tail: dict[int, list[int]] = {}
        self._size = 0

    def add(self, key: int, value: int) -> None:
        self._tail.setdefault(key, []).append(value)
        self._size += 1

    def get(self, key: int) -> list[int]:
        lo = int(np.searchsorted(self._keys, key, side="left"))
        hi = int(np.searchsorted(self._keys, key, side="right"))
        out = self._values[lo:hi].tolist()
        more = self._tail.get(key)
        return out + more if more else out

    def __len__(self) -> int:
        return self._size

    def compact(self) -> None:
        """Fold what was added since into the arrays."""
        if not self._tail:
            return
        keys = np.fromiter((k for k, vs in self._tail.items() for _ in vs), dtype=np.int64, count=self._size - len(self._keys))
        values = np.fromiter((v for vs in self._tail.values() for v in vs), dtype=np.int64, count=len(keys))
        keys, values = np.concatenate((self._keys, keys)), np.concatenate((self._values, values))
        by = np.argsort(keys, kind="stable")  # a key's earlier values stay first
        self._keys, self._values, self._tail = keys[by], values[by], {}

    def nbytes(self) -> int:
        return self._keys.nbytes + self._values.nbytes

    def __getstate__(self) -> dict[str, Any]:
        self.compact()  # a pickle holds the arrays only
        return dict(self.__dict__)
