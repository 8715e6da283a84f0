"""Int8 codes of unit vectors: the first pass of a large :class:`VectorIndex` (docs/memory.md,
"Quantised first pass").

Code of a row ``x`` (float32): ``k`` is the largest integer with ``max|x| * 2**k <= 127``
(found with :func:`numpy.frexp`, exact), ``code = rint(x * 2**k)`` (float64, exact scaling,
round half to even), stored as int8 with ``k``. The query is coded the same way from its
float64 unit vector. A row's quantised score is the integer ``sum(code_q * code_x)`` scaled by
``2**-k`` (the query's own scale is common to every row and dropped): every step is exact, so
the score is a pure function of the row's float32 bits and the query, whatever the row's
position, the order of the products or the machine.

Why exact: the products are integers of magnitude at most ``127 * 127``; their sums stay
below ``2**24`` when ``dim * 127 * 127 < 2**24`` (``dim <= 1040``), so float32 arithmetic,
whatever order BLAS adds them in, is exact (float64, exact below ``2**53``, above that dim).

Layout: dimension-major, ``codes[i, r]`` is coordinate ``i`` of row ``r``, so a query with few
non-zero coordinates (a hashed embedding of a short query: a few dozen) reads only those rows
of ``codes``; a dense query converts column blocks to float and multiplies them (one BLAS call
per block; about as slow as the float32 product at 1M rows, the conversion being the cost).
Both give the same integers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Int8Codes", "quantise_query", "quantise_rows"]

_LEVELS = 127
_BLOCK = 16384  # rows per step of a scoring pass (the float temporaries stay in cache)
# A query with at most this share of non-zero codes reads only their rows of ``codes`` (measured
# at 1M rows, 384 dims: 7 ms for 23 of them, 87 ms for 256, against 116-130 ms for every row).
_SPARSE_SHARE = 0.75


def _shifts(maxabs: np.ndarray) -> np.ndarray:
    """Largest ``k`` with ``maxabs * 2**k <= 127`` (0 where ``maxabs`` is 0)."""
    m, e = np.frexp(maxabs)  # maxabs = m * 2**e, 0.5 <= m < 1
    k = np.where(m <= _LEVELS / 128, 7 - e, 6 - e)
    return np.where(maxabs > 0, k, 0)


def quantise_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, shifts)`` of float32 rows ``(m, dim)``: codes ``(m, dim)`` int8, shifts ``(m,)`` int32."""
    r64 = np.asarray(rows, dtype=np.float64)
    k = _shifts(np.abs(r64).max(axis=1)).astype(np.int32)
    codes = np.rint(np.ldexp(r64, k[:, None]))
    return codes.astype(np.int8), k


def quantise_query(q64: np.ndarray) -> np.ndarray:
    """The integer code of a float64 query vector, as float64 (exact small integers)."""
    k = _shifts(np.abs(q64).max(keepdims=True))
    return np.rint(np.ldexp(q64, k.astype(np.int32)))


class Int8Codes:
    """The codes of the rows of a :class:`VectorIndex`, row ``r`` in column ``r``."""

    def __init__(self, dim: int, capacity: int) -> None:
        self.dim = dim
        self.codes = np.zeros((dim, capacity), dtype=np.int8)
        self.shifts = np.zeros(capacity, dtype=np.int32)
        # float32 sums are exact while every partial sum is an integer below 2**24
        self.acc: type[np.floating[Any]] = np.float32 if dim * _LEVELS * _LEVELS < 2**24 else np.float64
        # 2**-k per row, as the accumulator's type: scaling an exact integer by it is exact
        self.scales = np.zeros(capacity, dtype=self.acc)

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.shifts.nbytes + self.scales.nbytes

    def resize(self, capacity: int, n: int) -> None:
        codes = np.zeros((self.dim, capacity), dtype=np.int8)
        codes[:, :n] = self.codes[:, :n]
        shifts = np.zeros(capacity, dtype=np.int32)
        shifts[:n] = self.shifts[:n]
        scales = np.zeros(capacity, dtype=self.acc)
        scales[:n] = self.scales[:n]
        self.codes, self.shifts, self.scales = codes, shifts, scales

    def put(self, start: int, rows: np.ndarray) -> None:
        """Code the float32 ``rows`` into columns ``start, start + 1, ...``."""
        codes, shifts = quantise_rows(rows)
        self.codes[:, start : start + len(rows)] = codes.T
        self.shifts[start : start + len(rows)] = shifts
        self.scales[start : start + len(rows)] = np.ldexp(1.0, -shifts)

    def move(self, src: int, dst: int) -> None:
        self.codes[:, dst] = self.codes[:, src]
        self.shifts[dst] = self.shifts[src]
        self.scales[dst] = self.scales[src]

    def clear(self, r: int) -> None:
        self.codes[:, r] = 0
        self.shifts[r] = 0
        self.scales[r] = 0

    def scores(self, q: np.ndarray, n: int, rows: np.ndarray | None = None) -> np.ndarray:
        """Exact quantised scores of columns ``rows`` (all ``n`` if None) for the query code ``q``
        (from :func:`quantise_query`), as the accumulator's type (float32 up to 1040 dims)."""
        m = n if rows is None else len(rows)
        acc = np.empty(m, dtype=self.acc)
        nz = np.flatnonzero(q)
        qa = q.astype(self.acc)
        sparse = len(nz) <= _SPARSE_SHARE * self.dim
        for a in range(0, m, _BLOCK):
            b = min(m, a + _BLOCK)
            cols = slice(a, b) if rows is None else rows[a:b]
            out = acc[a:b]
            if sparse:
                block = self.codes[nz, cols] if rows is None else self.codes[nz[:, None], cols]
                np.matmul(qa[nz], block.astype(self.acc), out=out)
            else:
                np.matmul(qa, self.codes[:, cols].astype(self.acc), out=out)
        # integer * 2**-k: exact while it stays a normal number (any row near unit length)
        np.multiply(acc, self.scales[:n] if rows is None else self.scales[rows], out=acc)
        return acc
