"""Who is told what a database did: rows shown (or a rebuild), entries stored, ingest outcomes.

Observers outlive the derived state: a reload of the log rebuilds everything else, never the
list of who listens.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from memmesh.crdt.records import Outcome, Rebuilt, RowsAdded

log = logging.getLogger("memmesh.crdt.database")

RowListener = Callable[[RowsAdded | Rebuilt], None]
StoredListener = Callable[[tuple[str, ...]], None]
OutcomeListener = Callable[[Outcome], None]

_T = TypeVar("_T")


def _notify(listener: Callable[[_T], None], what: _T) -> None:
    """Tell one observer what a committed ingest did. Its failure is logged, never raised: the
    entries are stored, and an exception here would tell the writer (or the peer that sent
    them) that they were not."""
    try:
        listener(what)
    except Exception:
        log.exception("an observer of database ingests failed (%r); the ingest itself is committed", listener)


def _remover(listeners: list[_T], listener: _T) -> Callable[[], None]:
    def remove() -> None:
        if listener in listeners:
            listeners.remove(listener)
    return remove


class Observers:
    """The listeners of one database."""

    def __init__(self) -> None:
        self._rows: list[RowListener] = []
        self._stored: list[StoredListener] = []
        self._outcomes: list[OutcomeListener] = []

    # ------------------------------------------------------------------- rows shown
    def subscribe(self, listener: RowListener) -> None:
        self._rows.append(listener)

    def unsubscribe(self, listener: RowListener) -> None:
        if listener in self._rows:
            self._rows.remove(listener)

    def emit(self, event: RowsAdded | Rebuilt) -> None:
        # Row listeners keep derived views in step: their failure is the caller's to see.
        for listener in self._rows:
            listener(event)

    # ---------------------------------------------------------------- after a commit
    def on_stored(self, listener: StoredListener) -> Callable[[], None]:
        self._stored.append(listener)
        return _remover(self._stored, listener)

    def on_outcome(self, listener: OutcomeListener) -> Callable[[], None]:
        self._outcomes.append(listener)
        return _remover(self._outcomes, listener)

    @property
    def wants_stored(self) -> bool:
        return bool(self._stored)

    @property
    def wants_outcomes(self) -> bool:
        return bool(self._outcomes)

    def stored(self, ids: tuple[str, ...]) -> None:
        for listener in list(self._stored):
            _notify(listener, ids)

    def tell(self, outcome: Outcome) -> None:
        for listener in list(self._outcomes):
            _notify(listener, outcome)
