"""In-memory cosine-similarity index (DESIGN section 7: semantic ranking).

Behaviour:

* ``add(doc_id, vector)``: the vector must have shape ``(dim,)`` and finite entries; it
  is normalised on insert (in float64, norm = sqrt of the correctly rounded
  :func:`math.fsum` of squares) and stored as float32. A zero vector is stored as zeros
  and never matches.
* ``search(query_vec, limit=...)``: cosine similarity between the normalised query and
  every stored row; similarities <= 0 are dropped; best first, ties by the caller's
  ``tiebreak`` key (see :mod:`node.memory.fusion`).

Storage: a preallocated float32 matrix (rows x dim) that grows by doubling; removal
moves the last row into the hole, so the live rows are always ``matrix[:len(self)]``
and a query is one matrix-vector product, never a per-query stack of vectors.

Determinism (decision): BLAS float32 matrix-vector products give results that depend
on a row's position in the matrix (blocking and SIMD remainders; measured: the same
row at another position differs in the last bits), and row positions depend on the
history of adds and removals. So the float32 product only *selects* candidates, and
the candidates that can reach the result are rescored as float64
(``sum(float64(row) * q)``, an elementwise product and a per-row reduction over a
contiguous axis of fixed length, independent of the row's position). The selection is
safe: the float32 error is bounded by ``tol = (dim + 2) * 2**-23`` for unit vectors, a
prefix is taken down to ``t - 2*tol`` below the m-th best approximate score ``t``, and
only results whose exact score is >= ``t - tol`` are trusted before the prefix grows.
With ``limit=None`` every positive candidate is rescored.

Not thread-safe: callers serialise access.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .fusion import _check_limit, rank_candidates

__all__ = ["VectorIndex"]

_MIN_ROWS = 16
_RESCORE_CHUNK = 8192


def _as_doc_id(doc_id: Any) -> int:
    if isinstance(doc_id, bool) or not isinstance(doc_id, (int, np.integer)):
        raise TypeError(f"doc_id must be an int, got {type(doc_id).__name__}")
    return int(doc_id)


class VectorIndex:
    """Cosine-similarity index of ``dim``-dimensional vectors keyed by int doc id."""

    def __init__(self, dim: int) -> None:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        self.dim = int(dim)
        self._mat = np.zeros((_MIN_ROWS, self.dim), dtype=np.float32)
        self._ids = np.empty(_MIN_ROWS, dtype=np.int64)
        self._row: dict[int, int] = {}
        self._n = 0
        self._tol = (self.dim + 2) * 2.0**-23

    def __len__(self) -> int:
        return self._n

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._row

    @property
    def capacity(self) -> int:
        """Rows allocated (grows by doubling)."""
        return len(self._mat)

    def _unit64(self, vector: Any) -> np.ndarray:
        v = np.asarray(vector)
        if v.shape != (self.dim,):
            raise ValueError(f"expected a vector of shape ({self.dim},), got {v.shape}")
        if not (np.issubdtype(v.dtype, np.floating) or np.issubdtype(v.dtype, np.integer)):
            raise TypeError(f"vector must be numeric, got dtype {v.dtype}")
        v = v.astype(np.float64)
        if not np.all(np.isfinite(v)):
            raise ValueError("vector has non-finite entries")
        norm = math.sqrt(math.fsum((v * v).tolist()))
        if norm == 0.0:
            return np.zeros(self.dim, dtype=np.float64)
        return v / norm

    def add(self, doc_id: int, vector: np.ndarray) -> None:
        """Store ``vector`` (normalised) for ``doc_id``; the id must not be present."""
        doc_id = _as_doc_id(doc_id)
        if doc_id in self._row:
            raise ValueError(f"doc_id {doc_id} is already indexed")
        unit = self._unit64(vector).astype(np.float32)
        if self._n == len(self._mat):
            mat = np.zeros((2 * len(self._mat), self.dim), dtype=np.float32)
            mat[: self._n] = self._mat[: self._n]
            ids = np.empty(2 * len(self._ids), dtype=np.int64)
            ids[: self._n] = self._ids[: self._n]
            self._mat, self._ids = mat, ids
        r = self._n
        self._mat[r] = unit
        self._ids[r] = doc_id
        self._row[doc_id] = r
        self._n = r + 1

    def remove(self, doc_id: int) -> None:
        """Remove ``doc_id`` (KeyError if absent); the last row moves into its place."""
        doc_id = _as_doc_id(doc_id)
        r = self._row.pop(doc_id)
        last = self._n - 1
        if r != last:
            self._mat[r] = self._mat[last]
            moved = int(self._ids[last])
            self._ids[r] = moved
            self._row[moved] = r
        self._mat[last] = 0.0
        self._n = last

    def vector(self, doc_id: int) -> np.ndarray:
        """The stored (normalised, float32) vector of ``doc_id`` (a copy)."""
        return self._mat[self._row[_as_doc_id(doc_id)]].copy()

    def _exact(self, rows: np.ndarray, q64: np.ndarray) -> np.ndarray:
        out = np.empty(len(rows), dtype=np.float64)
        for a in range(0, len(rows), _RESCORE_CHUNK):
            block = self._mat[rows[a : a + _RESCORE_CHUNK]].astype(np.float64)
            block *= q64
            out[a : a + _RESCORE_CHUNK] = block.sum(axis=1)
        return out

    def search(
        self,
        query_vec: np.ndarray,
        *,
        limit: int | None,
        allowed: Callable[[int], bool] | None = None,
        tiebreak: Callable[[int], Any] | None = None,
    ) -> list[tuple[int, float]]:
        """Best-first ``(doc_id, cosine)`` with cosine > 0, at most ``limit`` (all if
        None), only ids with ``allowed(doc_id)`` true, ties by ``tiebreak(doc_id)``."""
        _check_limit(limit)
        q64 = self._unit64(query_vec)
        if self._n == 0 or limit == 0 or not q64.any():
            return []
        approx = self._mat[: self._n] @ q64.astype(np.float32)
        tol = self._tol
        cand = np.flatnonzero(approx > -tol)
        if len(cand) == 0:
            return []
        if limit is not None and allowed is not None:
            memo: dict[int, bool] = {}
            user_allowed = allowed

            def allowed(d: int) -> bool:  # noqa: F811 - memoised across prefixes
                v = memo.get(d)
                if v is None:
                    v = memo[d] = bool(user_allowed(d))
                return v

        m = len(cand) if limit is None else max(4 * limit, 64)
        while True:
            if m >= len(cand):
                rows = cand
                floor = None
            else:
                ca = approx[cand]
                t = float(np.partition(ca, len(ca) - m)[len(ca) - m])
                rows = cand[ca >= t - 2 * tol]
                floor = t - tol
            exact = self._exact(rows, q64)
            keep = exact > 0.0
            if floor is not None:
                keep &= exact >= floor
            result = rank_candidates(
                self._ids[rows[keep]], exact[keep], limit=limit, allowed=allowed, tiebreak=tiebreak
            )
            if floor is None or floor <= 0.0 or len(result) == limit:
                return result
            m *= 4
