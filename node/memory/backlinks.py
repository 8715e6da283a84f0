"""Where an edge points, and an index of the current rows by the keys their edges may name.

An edge's ``to`` is ``BANK:KEY`` when the text before its first colon names a bank on this node
(a bank name, an agent name, or a database id, whose own colon is part of it), else a key of the
edge's own bank (:func:`split_target`, docs/memory.md "Neighbors"). Which of those it is depends
on the node's bank names, which change without any row changing; so the index does not resolve:
it files each edge under every key its ``to`` could name (:func:`target_keys`: the whole text,
the text after the first colon, the text after a database id), and the caller resolves the few
candidates a lookup returns. A lookup costs the links that might point at the key, never a scan
of the rows.
"""
from __future__ import annotations

import re
from collections.abc import Callable

from .rows import SUPERSEDES, Memory

__all__ = ["Backlinks", "split_target", "target_keys"]

_DB_ID_PREFIX = re.compile(r"sha256:[0-9a-f]{64}:")


def split_target(to: str, resolve: Callable[[str], str | None]) -> tuple[str | None, str]:
    """``(database id or None, key)`` of an edge's ``to``; None: the edge's own bank.

    ``resolve`` maps a bank reference to a database id, or None when it names no bank."""
    match = _DB_ID_PREFIX.match(to)
    if match and len(to) > match.end():
        return match.group()[:-1], to[match.end():]
    prefix, colon, rest = to.partition(":")
    if colon and prefix and rest:
        db = resolve(prefix)
        if db is not None:
            return db, rest
    return None, to


def target_keys(to: str) -> tuple[str, ...]:
    """Every key :func:`split_target` can return for ``to``, whatever the bank names are."""
    keys = [to]
    match = _DB_ID_PREFIX.match(to)
    if match and len(to) > match.end():
        keys.append(to[match.end():])
    prefix, colon, rest = to.partition(":")
    if colon and prefix and rest and rest not in keys:
        keys.append(rest)
    return tuple(keys)


class Backlinks:
    """Docs of current rows, by the keys their links (edges other than ``supersedes``) may name."""

    def __init__(self) -> None:
        self._by_key: dict[str, set[int]] = {}

    def add(self, doc: int, m: Memory) -> None:
        for edge in m.edges:
            if edge.type != SUPERSEDES:
                for key in target_keys(edge.to):
                    self._by_key.setdefault(key, set()).add(doc)

    def remove(self, doc: int, m: Memory) -> None:
        for edge in m.edges:
            if edge.type != SUPERSEDES:
                for key in target_keys(edge.to):
                    docs = self._by_key.get(key)
                    if docs is not None:
                        docs.discard(doc)
                        if not docs:
                            del self._by_key[key]

    def docs(self, key: str) -> frozenset[int]:
        """Docs whose links may point at ``key`` (in some bank: the caller resolves)."""
        return frozenset(self._by_key.get(key, ()))

    def __len__(self) -> int:
        return len(self._by_key)
