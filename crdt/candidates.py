"""What each author keeps stored that is not valid: candidates a later event could make valid,
and equivocation evidence after a fork. Bounded per author (entries and bytes), so that no key
can grow a replica's log without limit by signing entries nobody accepts.
"""
from __future__ import annotations

from memmesh.crdt.errors import EntryRejected
from memmesh.crdt.records import MAX_UNACCEPTED_BYTES, MAX_UNACCEPTED_ENTRIES


class UnacceptedTally:
    """author -> (entries, bytes) stored but not valid."""

    def __init__(self) -> None:
        self._tally: dict[str, list[int]] = {}

    def of(self, author: str) -> tuple[int, int]:
        count, nbytes = self._tally.get(author, (0, 0))
        return count, nbytes

    def would_exceed(self, author: str, size: int) -> bool:
        count, nbytes = self.of(author)
        return count + 1 > MAX_UNACCEPTED_ENTRIES or nbytes + size > MAX_UNACCEPTED_BYTES

    def check(self, author: str, size: int, what: str) -> None:
        """Refuse one more such entry of ``author`` when it would pass the bound."""
        if self.would_exceed(author, size):
            count, nbytes = self.of(author)
            raise EntryRejected(
                "entry.candidate_bound",
                f"{author} already has {count} stored {what} ({nbytes} bytes; the bound is "
                f"{MAX_UNACCEPTED_ENTRIES} entries / {MAX_UNACCEPTED_BYTES} bytes); it is taken in "
                "again if it becomes needed or valid",
            )

    def count(self, author: str, size: int) -> None:
        tally = self._tally.setdefault(author, [0, 0])
        tally[0] += 1
        tally[1] += size

    def clear(self) -> None:
        self._tally = {}
