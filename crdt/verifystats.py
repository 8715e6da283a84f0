"""How many entry signatures this process verified, and the time it spent on them.

A process-wide counter (signatures are checked in crdt/entry.py and, for a large batch, partly
in the signature worker process: crdt/verify_process.py, whose check times are counted here
too), read by `memmesh status` to show the verify rate: signatures per second of
verification time, which says whether the machine keeps up with what peers send.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class VerifySnapshot:
    entries: int  # signatures verified (valid or not) since the process started
    seconds: float  # wall-clock time spent verifying them (a parallel batch counts once)

    @property
    def per_s(self) -> float | None:
        return self.entries / self.seconds if self.seconds > 0 else None


class VerifyCounter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries = 0
        self._seconds = 0.0

    def add(self, entries: int, seconds: float) -> None:
        with self._lock:
            self._entries += entries
            self._seconds += seconds

    def snapshot(self) -> VerifySnapshot:
        with self._lock:
            return VerifySnapshot(self._entries, self._seconds)


VERIFIED = VerifyCounter()


def clock() -> float:
    return time.perf_counter()
