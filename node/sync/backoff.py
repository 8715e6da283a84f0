"""The push backoff: a peer that keeps pushing invalid entries, or parks too many whose
parents it never sends, is refused for a while, doubling each time."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memmesh.node.sync import messages as m


def backoff_reply(blocked_ms: int, taken: str = "") -> m.ErrorReply:
    return m.ErrorReply("sync.backoff", f"too many invalid or parked entries from this peer; retry in "
                                        f"{blocked_ms // 1000 + 1} s{taken}")


@dataclass
class _Strikes:
    refused: int = 0
    until_ms: int = 0
    level: int = 0
    parked: int = 0
    parked_since_ms: int = 0


class PushBackoff:
    """A peer that keeps pushing invalid entries is refused for a while, doubling each time.

    Refusals that honest peers cause too (an entry that waits in the pending area and is
    evicted, a candidate over the bound) do not count. Entries parked in the pending area (their
    parents unknown) count too once a peer parks more than ``parked_threshold`` of them within
    ``parked_window_ms``: an honest peer pushes parents before children and parks next to none,
    while made-up parents cost the node work and park forever (until evicted or expired).
    """

    BENIGN = frozenset({"entry.pending_evicted", "entry.pending_expired", "entry.candidate_bound", "entry.erased"})

    def __init__(self, threshold: int = 32, base_ms: int = 5_000, max_ms: int = 3_600_000,
                 parked_threshold: int = 1024, parked_window_ms: int = 600_000) -> None:
        self.threshold = threshold
        self.base_ms = base_ms
        self.max_ms = max_ms
        self.parked_threshold = parked_threshold
        self.parked_window_ms = parked_window_ms
        self._peers: dict[str, _Strikes] = {}

    def blocked_for(self, peer: str, now_ms: int) -> int:
        s = self._peers.get(peer)
        return max(0, s.until_ms - now_ms) if s else 0

    def record(self, peer: str, refused: dict[str, int], now_ms: int, parked: int = 0) -> None:
        bad = sum(n for reason, n in refused.items() if reason not in self.BENIGN)
        if not bad and not parked:
            return
        s = self._peers.setdefault(peer, _Strikes())
        s.refused += bad
        if parked:
            if now_ms - s.parked_since_ms > self.parked_window_ms:
                s.parked, s.parked_since_ms = 0, now_ms
            s.parked += parked
        if s.refused >= self.threshold or s.parked > self.parked_threshold:
            s.until_ms = now_ms + min(self.max_ms, self.base_ms * (2 ** s.level))
            s.level += 1
            s.refused = 0
            s.parked, s.parked_since_ms = 0, now_ms
        if len(self._peers) > 10_000:  # bounded: forget the oldest
            self._peers.pop(next(iter(self._peers)))

    def room(self, peer: str, now_ms: int) -> int:
        """How many more entries ``peer`` may park before it is backed off (at least 1): a push
        is cut into chunks no larger, so it stops right where the bound is passed."""
        s = self._peers.get(peer)
        if s is None or now_ms - s.parked_since_ms > self.parked_window_ms:
            return self.parked_threshold + 1
        return max(1, self.parked_threshold + 1 - s.parked)

    def status(self, peer: str, now_ms: int) -> dict[str, Any]:
        s = self._peers.get(peer)
        return {"backoff_ms": self.blocked_for(peer, now_ms), "strikes": s.refused if s else 0,
                "parked": s.parked if s else 0, "level": s.level if s else 0}
