"""Causally consistent abstract events for the validity tests (crdt/validity.py), no crypto."""
from __future__ import annotations

import hashlib
from collections.abc import Iterable

from memmesh.auth.ops import GrantOp
from memmesh.auth.permissions import ADMIN
from memmesh.crdt.validity import Event, Op, merge_vv


class DagBuilder:
    """Builds causally consistent abstract events (tests and simulations, no crypto).

    Each author writes a linear feed; ``sees`` merges other events' causal pasts into what the
    author knows before it writes, so concurrency is whatever the caller makes of it.
    """

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._feeds: dict[str, list[Event]] = {}
        self._known: dict[str, dict[str, int]] = {}

    def root(self, author: str, ops: Iterable[Op] = (), id: str | None = None) -> Event:
        """The root: Admin(0) to ``author``, then ``ops``."""
        first = GrantOp(author, ADMIN, 0)
        return self._make(author, (first, *ops), {}, True, id)

    def add(self, author: str, ops: Iterable[Op] = (), sees: Iterable[Event] = (),
            id: str | None = None) -> Event:
        """A new event by ``author`` after everything it knows plus the pasts of ``sees``."""
        vv = merge_vv(self._known.get(author, {}), *(s.vv for s in sees))
        return self._make(author, tuple(ops), vv, False, id)

    def learn(self, author: str, *sees: Event) -> None:
        """``author`` syncs: it now knows the causal pasts of ``sees``."""
        self._known[author] = merge_vv(self._known.get(author, {}), *(s.vv for s in sees))

    def knows(self, author: str) -> dict[str, int]:
        return dict(self._known.get(author, {}))

    def _make(self, author: str, ops: tuple[Op, ...], vv: dict[str, int], is_root: bool,
              id: str | None) -> Event:
        feed = self._feeds.setdefault(author, [])
        seq = len(feed)
        heights = [self._feeds[a][s].height for a, s in vv.items()]
        vv[author] = seq
        height = 1 + max(heights) if heights else 0
        if id is None:
            body = repr((author, seq, sorted(vv.items()), [op.to_value() for op in ops], is_root))
            id = "sha256:" + hashlib.sha256(body.encode()).hexdigest()
        ev = Event(id, author, seq, height, vv, ops, is_root)
        feed.append(ev)
        self.events.append(ev)
        self._known[author] = dict(vv)
        return ev
