"""Strings numbered 0, 1, 2, ... in order of first sight (a view's memory keys, row keys, BM25
vocabulary), looked up by string without a dict being made on opening.

A dict of a million strings costs about 0.4 s to rebuild from a view snapshot
(node/memory/snapshot.py), most of it hashing and inserting: three of them (keys, row keys,
vocabulary) were a second of opening a 1M-row view. So a snapshot holds the strings as a list
(cheap to read back) and, out of band, a table of 64-bit BLAKE2b hashes of them, sorted, with
their ids: a lookup is one hash, one binary search and a comparison with the string itself (a
collision costs a comparison more, never a wrong answer). The dict is made on the first write
(about as long as reading it would have taken), so a view only searched never makes it, and
one that is written pays it once, later.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

__all__ = ["StrIds"]

_EMPTY_U64 = np.empty(0, dtype=np.uint64)
_EMPTY_I64 = np.empty(0, dtype=np.int64)


def _hash(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


class StrIds:
    """str -> id and id -> str, ids dense from 0 in order of first sight."""

    def __init__(self, strings: Iterable[str] = ()) -> None:
        self._strings: list[str] = list(strings)
        self._dict: dict[str, int] | None = dict(zip(self._strings, range(len(self._strings))))
        if len(self._dict) != len(self._strings):
            raise ValueError("the strings must be distinct")
        self._hashes = _EMPTY_U64  # sorted hashes of strings[:hashed], with their ids
        self._ids = _EMPTY_I64

    # ------------------------------------------------------------------ reading
    def get(self, s: str) -> int | None:
        """The string's id, or None."""
        if self._dict is not None:
            return self._dict.get(s)
        h = _hash(s)
        hashes, strings = self._hashes, self._strings
        at = int(np.searchsorted(hashes, h))
        while at < len(hashes) and int(hashes[at]) == h:
            i = int(self._ids[at])
            if strings[i] == s:
                return i
            at += 1
        return None

    def __getitem__(self, s: str) -> int:
        i = self.get(s)
        if i is None:
            raise KeyError(s)
        return i

    def __contains__(self, s: object) -> bool:
        return isinstance(s, str) and self.get(s) is not None

    def __len__(self) -> int:
        return len(self._strings)

    def __iter__(self) -> Iterator[str]:
        """The strings in id order."""
        return iter(self._strings)

    @property
    def strings(self) -> list[str]:
        """id -> string (the list itself: read, never change it)."""
        return self._strings

    # ------------------------------------------------------------------ writing
    def as_dict(self) -> dict[str, int]:
        """string -> id, made now if it is not (the bulk writers read and extend it through
        :meth:`add` and :meth:`extend` only)."""
        if self._dict is None:
            self._dict = dict(zip(self._strings, range(len(self._strings))))
        return self._dict

    def add(self, s: str) -> int:
        """The string's id, the next one if it is new."""
        d = self.as_dict()
        i = d.get(s)
        if i is None:
            i = d[s] = len(self._strings)
            self._strings.append(s)
        return i

    def extend(self, new: list[str]) -> None:
        """Number strings none of which has an id yet, in order."""
        d = self.as_dict()
        if len(set(new)) != len(new) or any(s in d for s in new):
            raise ValueError("extend: a string already had an id")
        first = len(self._strings)
        d.update(zip(new, range(first, first + len(new))))
        self._strings.extend(new)

    def nbytes(self) -> int:
        """Bytes of the hash table (the strings themselves are Python objects)."""
        return self._hashes.nbytes + self._ids.nbytes

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> dict[str, Any]:
        n_hashed = len(self._hashes)
        if n_hashed < len(self._strings):  # hash what was added since, merge it into the table
            new = np.fromiter((_hash(s) for s in self._strings[n_hashed:]), dtype=np.uint64,
                              count=len(self._strings) - n_hashed)
            hashes = np.concatenate((self._hashes, new))
            ids = np.concatenate((self._ids, np.arange(n_hashed, len(self._strings), dtype=np.int64)))
            by = np.argsort(hashes, kind="stable")
            self._hashes, self._ids = hashes[by], ids[by]
        return {"_strings": self._strings, "_hashes": self._hashes, "_ids": self._ids}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._dict = None
