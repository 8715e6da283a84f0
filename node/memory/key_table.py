"""The memory keys of a view: each key's id (its group in the timeline table,
node/memory/timetable.py), and per key id the doc of its current row and of its newest row, as
arrays rather than a dict per question (a million keys cost two int64 arrays, and a view
snapshot maps them from its file; node/memory/snapshot.py).

A key's current row is its newest row unless a newer row of another key retired it with a
``supersedes`` edge (node/memory/view_feed.py decides; this table only holds the answers).
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .str_ids import StrIds

__all__ = ["KeyTable"]

_NONE = -1
_GROW = 64


class KeyTable:
    """key -> id; id -> doc of the current row, doc of the newest row (-1: none)."""

    def __init__(self) -> None:
        self.ids = StrIds()
        self._current = np.full(_GROW, _NONE, dtype=np.int64)
        self._newest = np.full(_GROW, _NONE, dtype=np.int64)
        self.currents = 0  # keys with a current row

    def id(self, key: str) -> int:
        """The key's id, given on first sight (ids are 0, 1, 2, ... in that order)."""
        kid = self.ids.get(key)
        if kid is None:
            kid = self.ids.add(key)
            if kid >= len(self._current):
                cap = kid + 1 + (kid + 1) // 2
                for name in ("_current", "_newest"):
                    grown = np.full(cap, _NONE, dtype=np.int64)
                    grown[: kid] = getattr(self, name)[: kid]
                    setattr(self, name, grown)
        return kid

    def current(self, key: str) -> int | None:
        """The doc of the key's current row, or None."""
        kid = self.ids.get(key)
        if kid is None:
            return None
        doc = int(self._current[kid])
        return None if doc == _NONE else doc

    def set_current(self, key: str, doc: int) -> None:
        kid = self.id(key)
        self.currents += int(self._current[kid] == _NONE)
        self._current[kid] = doc

    def drop_current(self, key: str) -> int | None:
        """No current row for the key any more; the doc that was, or None."""
        doc = self.current(key)
        if doc is not None:
            self._current[self.ids[key]] = _NONE
            self.currents -= 1
        return doc

    def newest(self, key: str) -> int | None:
        kid = self.ids.get(key)
        if kid is None:
            return None
        doc = int(self._newest[kid])
        return None if doc == _NONE else doc

    def set_newest(self, key: str, doc: int) -> None:
        self._newest[self.id(key)] = doc

    def load(self, newest: dict[str, int], current: list[tuple[str, int]]) -> None:
        """After a bulk build: every key's newest doc, and (key, doc) of every current row."""
        for key, doc in newest.items():
            self._newest[self.id(key)] = doc
        for key, doc in current:
            self.set_current(key, doc)

    def current_docs(self) -> np.ndarray:
        """The docs of every current row, ascending."""
        docs = self._current[: len(self.ids)]
        return np.sort(docs[docs != _NONE])

    def current_items(self) -> Iterator[tuple[str, int]]:
        """(key, doc of its current row) for every key that has one."""
        current = self._current
        for kid, key in enumerate(self.ids.strings):
            if current[kid] != _NONE:
                yield key, int(current[kid])

    def __len__(self) -> int:
        return self.currents

    def nbytes(self) -> int:
        return self._current.nbytes + self._newest.nbytes + self.ids.nbytes()
