"""Row keys shown per store, kept as clock ranges: what ``DerivedState.show`` compares against.

A row key is a string that starts with its author's client id, ``f"{client}/"``; rows written
through a transaction are keyed ``f"{client}/{clock}"`` with the row's own Yjs clock, so the
rows of one payload cover one clock range. Holding those as ranges instead of strings keeps
what open builds small (a range per payload, not a string per row) and lets a payload whose
keys are known to follow that rule be shown without decoding it (crdt/open_marks.py).

Comparison is exactly string equality of keys: a key ``f"{c}/{n}"`` with ``n`` written in
canonical decimal is held as the point ``n`` of client ``c``; every other key as its string.
The two forms never name the same string.
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from memmesh.crdt.yjs import Row


@dataclass(frozen=True, slots=True)
class KeyRange:
    """The keys ``f"{client}/{clock}"`` .. ``f"{client}/{clock + length - 1}"`` of one payload."""

    client: int
    clock: int
    length: int


# A store's rows as show needs them: decoded rows, or the range of keys they are known to have.
ShownKeys = tuple[Row, ...] | KeyRange


def as_point(client: int, key: str) -> int | None:
    """``n`` when ``key`` is ``f"{client}/{n}"`` in canonical decimal, else None."""
    prefix = f"{client}/"
    if not key.startswith(prefix):
        return None
    digits = key[len(prefix):]
    if not (digits.isascii() and digits.isdigit()) or (digits[0] == "0" and len(digits) > 1):
        return None
    return int(digits)


def canonical(rows: Sequence[Row], client: int, clock: int) -> bool:
    """Are the rows keyed by their own clocks, ``f"{client}/{clock + i}"``?"""
    if len(rows) == 1:  # the common payload: one row
        return rows[0].key == f"{client}/{clock}"
    return all(row.key == f"{client}/{clock + i}" for i, row in enumerate(rows))


class LiveKeys:
    """The row keys shown in one store: disjoint clock intervals per client, plus other keys."""

    __slots__ = ("_starts", "_ends", "_other")

    def __init__(self) -> None:
        self._starts: dict[int, list[int]] = {}  # client -> interval starts, sorted
        self._ends: dict[int, list[int]] = {}  # client -> the matching ends (exclusive)
        self._other: set[str] = set()

    def add_if_new(self, rows: ShownKeys, client: int) -> bool:
        """Add every key of ``rows`` (a payload of ``client``) unless one is already here;
        returns whether they were added. A payload never repeats a key (yjs.duplicate_key)."""
        if isinstance(rows, KeyRange):
            if rows.length and self._overlaps(rows.client, rows.clock, rows.clock + rows.length):
                return False
            if rows.length:
                self._insert(rows.client, rows.clock, rows.clock + rows.length)
            return True
        points: list[int] = []
        others: list[str] = []
        for row in rows:
            n = as_point(client, row.key)
            if n is None:
                others.append(row.key)
            else:
                points.append(n)
        if any(k in self._other for k in others) or any(self._overlaps(client, n, n + 1) for n in points):
            return False
        self._other.update(others)
        for lo, hi in _runs(sorted(points)):
            self._insert(client, lo, hi)
        return True

    def _overlaps(self, client: int, lo: int, hi: int) -> bool:
        starts = self._starts.get(client)
        if not starts:
            return False
        i = bisect_right(starts, lo)
        if i and self._ends[client][i - 1] > lo:
            return True
        return i < len(starts) and starts[i] < hi

    def _insert(self, client: int, lo: int, hi: int) -> None:
        starts = self._starts.setdefault(client, [])
        ends = self._ends.setdefault(client, [])
        i = bisect_right(starts, lo)
        if i and ends[i - 1] == lo:  # continues the interval before it (a feed's next payload)
            ends[i - 1] = hi
            if i < len(starts) and starts[i] == hi:  # and closes the gap to the next one
                ends[i - 1] = ends[i]
                del starts[i], ends[i]
            return
        if i < len(starts) and starts[i] == hi:
            starts[i] = lo
            return
        starts.insert(i, lo)
        ends.insert(i, hi)


def _runs(points: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted distinct points as maximal [lo, hi) runs."""
    out: list[tuple[int, int]] = []
    for n in points:
        if out and out[-1][1] == n:
            out[-1] = (out[-1][0], n + 1)
        else:
            out.append((n, n + 1))
    return out
