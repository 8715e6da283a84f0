"""Access counts: how often each memory was used on this node, peer-local and never synced.

Per (database, memory key) the node keeps how many times ``recall`` returned the memory, how
many times auto-recall injected it into a Relevant Memories block, and when either last
happened (this node's wall clock, informational only). Counting is per memory *key*: a newer
row for the key (a change of the memory) keeps the count.

Why peer-local: a read must not become a write to any database. Counts in the signed log would
turn every recall into an entry, a new head and sync traffic for every replica, and would tell
every reader of a bank what each agent looked up. So they live in the storage's peer-local
table (namespace ``memory-access``, one record per memory) beside the agent and bank
registries, and each node counts its own use.

Why one transaction per call is fine: a call's updates (every memory one recall returned, or
every line of one auto-recall block, across all its stores) are written by one
``put_local_many``, a single small SQLite transaction; in WAL mode with ``synchronous=NORMAL``
a commit appends a few pages to the WAL without an fsync, tens of microseconds next to the
milliseconds of ranking. Records are read once per process into memory (one home is open in
one process at a time, so the copy cannot go stale) and the copy changes only after the write
succeeded.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from memmesh.crdt.errors import StorageError
from memmesh.crdt.storage import Storage
from memmesh.node.memory.rows import _iso_utc as iso_time  # the one rendering of times in results

NS_ACCESS = "memory-access"

log = logging.getLogger(__name__)

Use = Literal["recall", "injection"]


@dataclass(frozen=True)
class Access:
    """What this node counted for one memory key of one database."""

    recalls: int = 0
    injections: int = 0
    last: int | None = None  # ms since the epoch of the last recall or injection

    @property
    def count(self) -> int:
        return self.recalls + self.injections

    def used(self, use: Use, now: int) -> Access:
        if use == "recall":
            return Access(self.recalls + 1, self.injections, now)
        return Access(self.recalls, self.injections + 1, now)

    def fields(self) -> dict[str, Any]:
        """The fields a recall result or a stats row shows."""
        return {"access_count": self.count, "recalls": self.recalls, "injections": self.injections,
                "last_access": None if self.last is None else iso_time(self.last)}


NEVER = Access()


def _record_key(db_id: str, key: str) -> str:
    # Database ids hold no space; the memory key is JSON text, so a key holding NUL (which
    # peer-local keys may not) still has its own record and the mapping stays one-to-one.
    return f"{db_id} {json.dumps(key, ensure_ascii=False)}"


def _parse(record_key: str, raw: bytes) -> tuple[str, str, Access] | None:
    try:
        db_id, key_text = record_key.split(" ", 1)
        key = json.loads(key_text)
        value = json.loads(raw)
        access = Access(int(value["r"]), int(value["i"]), None if value.get("t") is None else int(value["t"]))
    except (ValueError, KeyError, TypeError):
        return None  # a record this module did not write: ignored, as if never counted
    return (db_id, key, access) if isinstance(key, str) else None


class AccessCounts:
    """The node's access counts. Not thread-safe: serve's database thread serialises calls."""

    def __init__(self, storage: Storage, clock: Callable[[], float] = time.time) -> None:
        self._storage = storage
        self._clock = clock
        self._by_db: dict[str, dict[str, Access]] | None = None

    def _counts(self) -> dict[str, dict[str, Access]]:
        if self._by_db is None:
            by_db: dict[str, dict[str, Access]] = {}
            for record_key, raw in self._storage.items_local(NS_ACCESS):
                parsed = _parse(record_key, raw)
                if parsed is not None:
                    by_db.setdefault(parsed[0], {})[parsed[1]] = parsed[2]
            self._by_db = by_db
        return self._by_db

    def get(self, db_id: str, key: str) -> Access:
        return self._counts().get(db_id, {}).get(key, NEVER)

    def of_database(self, db_id: str) -> dict[str, Access]:
        """Every memory key of ``db_id`` this node counted, with its counts."""
        return dict(self._counts().get(db_id, {}))

    def record(self, uses: Iterable[tuple[str, str]], use: Use) -> dict[tuple[str, str], Access]:
        """Count one ``use`` of each (database id, memory key), in one transaction; a pair
        given twice in one call counts once. Returns the new counts ({} when they could not be
        written: the use goes uncounted, the caller answers anyway)."""
        now = int(self._clock() * 1000)
        counts = self._counts()
        new: dict[tuple[str, str], Access] = {}
        for db_id, key in uses:
            if (db_id, key) not in new:
                new[(db_id, key)] = counts.get(db_id, {}).get(key, NEVER).used(use, now)
        if not new:
            return new
        try:
            self._storage.put_local_many(NS_ACCESS, [
                (_record_key(db_id, key), json.dumps({"r": a.recalls, "i": a.injections, "t": a.last}).encode())
                for (db_id, key), a in new.items()])
        except StorageError as exc:
            # A count is a side note of a read: when it cannot be written (a full disk) the
            # read still answers, with the counts as they were; this use goes uncounted.
            log.warning("could not count %d memory use(s) (%s): %s", len(new), use, exc)
            return {}
        for (db_id, key), access in new.items():  # only once the write committed
            counts.setdefault(db_id, {})[key] = access
        return new
