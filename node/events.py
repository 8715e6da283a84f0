"""The live event stream of one `memmesh serve` run (docs/api.md, "Events, metrics and health").

    bus = EventBus()                       # a random run id; ids from 1, strictly increasing
    bus.attach(loop)                       # subscribers are woken on this asyncio loop
    bus.publish("bank.shared", {...})      # from any thread (the database thread, mostly)
    batch = bus.read(after=41, types={"entry.refused"})

The bus is a bounded ring (``capacity`` events, 10,000 by default): a reader that falls further
behind than the ring holds is told which ids it missed (``Batch.missed``) instead of the
publisher waiting for it or the buffer growing, so a slow or stuck client never holds serve
back. Readers keep their own cursor; nothing is queued per subscriber.

``DatabaseWatch`` turns what the node's databases do into events: every database the node
opens is watched (``Home.on_open``), its ingests (``Database.on_outcome``) become
``entry.accepted`` / ``entry.refused``, and a change of its settings ``grant.changed``. The
sync daemon publishes peer and lag events, the sharing commands bank events, all through
``node.network.publish``.
"""
from __future__ import annotations

import asyncio
import itertools
import secrets
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memmesh.crdt.clock import now_ms
from memmesh.crdt.database import SETTINGS, Database
from memmesh.crdt.records import Outcome

if TYPE_CHECKING:
    from memmesh.node.library import Node

EVENT_TYPES = ("entry.accepted", "entry.refused", "peer.connected", "peer.lost", "lag.changed",
               "grant.changed", "bank.imported", "bank.shared", "bank.unshared")
DEFAULT_CAPACITY = 10_000


class UnknownEventType(ValueError):
    """A type no publisher sends (a bug in the caller, never a user's input)."""


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    type: str
    data: dict[str, Any]
    at_ms: int  # wall-clock time it was published (informational)


@dataclass(frozen=True, slots=True)
class Batch:
    """What a reader gets: the events after its cursor, and where to read from next."""

    events: tuple[Event, ...]
    cursor: int  # the last id this read covered (filtered-out events included): the next ``after``
    missed: tuple[int, int] | None = None  # ids (from, to) that left the ring before this read


class EventBus:
    def __init__(self, capacity: int = DEFAULT_CAPACITY, run: str | None = None) -> None:
        if capacity < 1:
            raise ValueError("an event bus holds at least one event")
        self.run = run or secrets.token_hex(8)
        self.capacity = capacity
        self._lock = threading.Lock()
        self._ring: deque[Event] = deque(maxlen=capacity)
        self._last = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: set[asyncio.Event] = set()
        self._wake_scheduled = False
        self.closed = False

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    @property
    def attached(self) -> bool:
        return self._loop is not None

    @property
    def last_id(self) -> int:
        return self._last

    def publish(self, type_: str, data: dict[str, Any]) -> int:
        """Append an event (any thread); its id."""
        if type_ not in EVENT_TYPES:
            raise UnknownEventType(f"unknown event type {type_!r} (known: {', '.join(EVENT_TYPES)})")
        with self._lock:
            self._last += 1
            self._ring.append(Event(self._last, type_, data, now_ms()))
            # One wake-up per burst: a sync page of 500 entries is one call on the loop, not 500.
            schedule = not self._wake_scheduled and self._loop is not None and bool(self._waiters)
            self._wake_scheduled = self._wake_scheduled or schedule
            return_id = self._last
        if schedule:
            assert self._loop is not None
            try:
                self._loop.call_soon_threadsafe(self._wake)
            except RuntimeError:  # the loop closed: nobody is listening any more
                with self._lock:
                    self._wake_scheduled = False
        return return_id

    def read(self, after: int, types: Iterable[str] | None = None) -> Batch:
        """The events with an id above ``after`` (of ``types`` only, when given), oldest first."""
        wanted = None if types is None else frozenset(types)
        with self._lock:
            last = self._last
            oldest = self._ring[0].id if self._ring else last + 1
            missed = (after + 1, oldest - 1) if after < oldest - 1 else None
            # Ids in the ring are contiguous, so the first one wanted sits at a known index.
            tail = list(itertools.islice(self._ring, max(0, after + 1 - oldest), None))
        events = tuple(e for e in tail if wanted is None or e.type in wanted)
        return Batch(events, max(after, last), missed)

    # ------------------------------------------------------------------ waiting (on the loop)
    def subscribe(self) -> Subscription:
        return Subscription(self)

    def _wake(self) -> None:
        with self._lock:
            self._wake_scheduled = False
            waiters = list(self._waiters)
        for w in waiters:
            w.set()

    def close(self) -> None:
        """serve is stopping: every follower ends (call on the loop)."""
        self.closed = True
        self._wake()


class Subscription:
    """One follower's wake-ups: ``clear()`` before reading, then ``wait()``, so an event published
    in between is never slept through."""

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus
        self._event = asyncio.Event()
        with bus._lock:
            bus._waiters.add(self._event)

    def clear(self) -> None:
        self._event.clear()

    async def wait(self, timeout: float) -> bool:
        """True when something was published (or the bus closed), False after ``timeout``."""
        if self._bus.closed:
            return True
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        with self._bus._lock:
            self._bus._waiters.discard(self._event)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def source_of(source: str) -> str:
    """What an event calls who delivered an entry: the peer's key, or "local"."""
    return source[len("peer:"):] if source.startswith("peer:") else (source or "local")


# ---------------------------------------------------------------------- the databases' events
class DatabaseWatch:
    """Publishes ``entry.accepted``, ``entry.refused`` and ``grant.changed`` for every database
    the node opens. Runs on the database thread (where ingests happen)."""

    def __init__(self, node: Node, publish: Callable[[str, dict[str, Any]], object]) -> None:
        self.node = node
        self.publish = publish
        self._grants: dict[str, dict[str, tuple[str | None, str]]] = {}
        self._off: list[Callable[[], None]] = []

    def start(self) -> None:
        self._off.append(self.node.on_open(self._watch))

    def stop(self) -> None:
        for off in reversed(self._off):
            off()
        self._off.clear()

    def _watch(self, db: Database) -> None:
        self._grants[db.id] = _grants(db)
        self._off.append(db.on_outcome(lambda outcome: self._told(db, outcome)))

    def _told(self, db: Database, outcome: Outcome) -> None:
        bank = self.node.agents.name_of(db.id)
        for entry_id, author in outcome.accepted:
            self.publish("entry.accepted", {"db": db.id, "bank": bank, "entry": entry_id, "author": author,
                                            "source": source_of(outcome.source)})
        for r in outcome.refused:
            self.publish("entry.refused", {"db": db.id, "bank": bank, "entry": r.id, "author": r.author,
                                           "source": source_of(r.source), "reason": r.reason})
        if any(_touches_settings(db, entry_id) for entry_id, _ in outcome.accepted):
            self._grants_changed(db, bank)

    def _grants_changed(self, db: Database, bank: str) -> None:
        # Compared with what the settings said before, so a revocation that voids a grant made
        # elsewhere shows up as the key it changed, whichever entry carried it.
        before, after = self._grants.get(db.id, {}), _grants(db)
        self._grants[db.id] = after
        for key in sorted(set(before) | set(after)):
            if before.get(key) != after.get(key):
                level, status = after.get(key, (None, "revoked"))
                self.publish("grant.changed", {"db": db.id, "bank": bank, "key": key, "level": level,
                                               "status": status})


def _touches_settings(db: Database, entry_id: str) -> bool:
    entry = db.entry(entry_id)
    return entry is not None and SETTINGS in entry.stores


def _grants(db: Database) -> dict[str, tuple[str | None, str]]:
    """key -> (level, status) as the settings say now."""
    return {key: (None if state.permission is None else state.permission.level, state.status)
            for key, state in db.settings().items()}
