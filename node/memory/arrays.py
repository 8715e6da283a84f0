"""Growable numpy arrays and the doc ids the indexes over them take."""
from __future__ import annotations

from typing import Any

import numpy as np

MIN_CAP = 4
EMPTY_I64 = np.empty(0, dtype=np.int64)


def grown(arr: np.ndarray, need: int) -> np.ndarray:
    """A copy of ``arr`` with room for ``need`` items (capacity grows by 1.5x)."""
    cap = max(MIN_CAP, len(arr))
    while cap < need:
        cap += cap // 2
    return resized(arr, cap)


def resized(arr: np.ndarray, cap: int) -> np.ndarray:
    new = np.empty(cap, dtype=arr.dtype)
    n = min(len(arr), cap)
    new[:n] = arr[:n]
    return new


def tf_dtype(max_tf: int) -> type:
    """The narrowest type holding every tf exactly (scored as float64, an exact conversion)."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if max_tf <= np.iinfo(dtype).max:
            return dtype
    return np.float64


def as_doc_id(doc_id: Any) -> int:
    if isinstance(doc_id, bool) or not isinstance(doc_id, (int, np.integer)):
        raise TypeError(f"doc_id must be an int, got {type(doc_id).__name__}")
    return int(doc_id)


def group_order(keys: np.ndarray) -> np.ndarray:
    """Indexes sorting ``keys`` (int64 >= 0) stably: equal keys keep their input order."""
    n = len(keys)
    if n == 0:
        return EMPTY_I64
    top = int(keys.max())
    if top < (2**62) // n:
        # One plain sort of (key, position) packed in an int64: faster than a stable argsort.
        packed = keys * n + np.arange(n, dtype=np.int64)
        packed.sort()
        return packed % n
    return np.argsort(keys, kind="stable")
