"""The wall clock in milliseconds since the epoch: the one ``now_ms`` of crdt/ and node/."""
from __future__ import annotations

import time

__all__ = ["now_ms"]


def now_ms() -> int:
    return time.time_ns() // 1_000_000
