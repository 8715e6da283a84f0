"""Retention and forgetting: a signed per-database policy, its preview, and its run.

A policy is a row of the database's ``retention`` store, exactly::

    {"op": "policy", "days": N, "compress_after": N | null, "success_x": K, "failure_x": K,
     "keep_promoted_evidence": bool}

(days: whole numbers 1-36,500; multipliers: numbers from 0.1 to 100). Any writer can store
such a row; one **counts** only when its signer held Admin in the settings of its entry's
causal past (as for quarantines, node/memory/quarantine.py), and the policy in force is the
newest counting row in T order, so every replica holding the same entries applies the same
policy.

What a run forgets, at the caller's "now" (ms), from signed facts only (entry timestamps,
rows), so the same entries and the same now give the same set on every replica:

* **Compression of the raw record**: the text of a history turn whose entry is older than
  ``compress_after`` days and that a level-1 chunk covers (same session, seq within the
  chunk's range) is no longer needed word for word: the chunk's summary stands for it. A
  ``history_text`` payload is erased when every text it holds is referenced only by such turns
  (texts are stored once and shared by every turn that repeats them). The turn rows stay, so
  the pyramid and its drill-down keep their shape; a compressed turn shows no text.
* **Forgetting episodes**: an episode older than ``days`` x ``success_x`` (outcome success),
  ``days`` x ``failure_x`` (failure) or ``days`` (unknown) is erased, except episodes a person
  checked (``checked_by: person``), which are kept, and, with ``keep_promoted_evidence``, the
  evidence of a promoted method (the episodes its promotion names, and every successful
  episode of its kind whose tool sequence is the method's).

* **Erasing retired memory rows** (only with ``erase_retired_memories``): a ``memory`` payload
  whose every row has been no longer current (superseded by a newer row of its key, retired by
  another key's ``supersedes`` edge, or past its ``valid_to``) for more than ``days``, counted
  from the entry that superseded it or from its ``valid_to``; and each embeddings payload whose
  every vector belongs to such rows (node/memory/forgetting.py). Current memories are never
  erased by retention; without the option memory rows are never touched.

The option is a field of the policy row only when it is on (``"erase_retired_memories": true``),
so a policy without it is the same row as before, and every node reads both shapes.

Erasures are the signed erase entries of the hardening issue (crdt/erasure.py): they replicate
and every replica deletes the same payloads. The entries, their ids and signatures stay.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memmesh.auth.keys import SigningKey
from memmesh.auth.permissions import ADMIN
from memmesh.crdt.database import Database, RowRecord
from memmesh.crdt.erasure import ERASE, EraseOp
from memmesh.crdt.errors import MemmeshError

log = logging.getLogger(__name__)

__all__ = ["Policy", "PolicyError", "RETENTION_STORE", "Forget", "plan", "policy_in_force", "policy_value",
           "run"]

RETENTION_STORE = "retention"
HISTORY_STORE = "history"
HISTORY_TEXT_STORE = "history_text"
CHUNKS_STORE = "history_chunks"
EPISODES_STORE = "episodes"
DAY_MS = 86_400_000
MAX_DAYS = 36_500
MULTIPLIER = (0.1, 100.0)
ERASES_PER_ENTRY = 256  # erase rows per signed entry: one entry per payload would be wasteful
_FIELDS = frozenset({"op", "days", "compress_after", "success_x", "failure_x", "keep_promoted_evidence"})
ERASE_MEMORIES = "erase_retired_memories"  # present (and true) only when the option is on


class PolicyError(MemmeshError):
    """A retention policy, or a request about one, that is refused; nothing was written."""


@dataclass(frozen=True)
class Policy:
    days: int
    compress_after: int | None = None
    success_x: float = 1.0
    failure_x: float = 1.0
    keep_promoted_evidence: bool = False
    erase_retired_memories: bool = False
    entry: str | None = None  # the entry that holds it (None: not stored yet)
    by: str | None = None  # its signer

    def value(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": "policy", "days": self.days, "compress_after": self.compress_after,
                               "success_x": self.success_x, "failure_x": self.failure_x,
                               "keep_promoted_evidence": self.keep_promoted_evidence}
        if self.erase_retired_memories:
            out[ERASE_MEMORIES] = True
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**self.value(), "entry": self.entry, "by": self.by}


def _optional_days(what: str, n: Any) -> int | None:
    return None if n is None else _days(what, n)


def _days(what: str, n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_DAYS:
        raise PolicyError(f"{what} is a whole number of days from 1 to {MAX_DAYS}, got {n!r}")
    return n


def _multiplier(what: str, x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) \
            or not MULTIPLIER[0] <= x <= MULTIPLIER[1]:
        raise PolicyError(f"{what} is a number from {MULTIPLIER[0]} to {MULTIPLIER[1]:g}, got {x!r}")
    return float(x)


def policy_value(days: Any, compress_after: Any = None, success_x: Any = 1.0, failure_x: Any = 1.0,
                 keep_promoted_evidence: Any = False, erase_retired_memories: Any = False) -> Policy:
    """A policy from user input; PolicyError with the rule when any part breaks it."""
    for name, flag in (("keep_promoted_evidence", keep_promoted_evidence),
                       (ERASE_MEMORIES, erase_retired_memories)):
        if not isinstance(flag, bool):
            raise PolicyError(f"{name} is true or false, got {flag!r}")
    return Policy(_days("days", days), _optional_days("compress_after", compress_after),
                  _multiplier("success_gone_x", success_x), _multiplier("failure_gone_x", failure_x),
                  keep_promoted_evidence, erase_retired_memories)


def _parse(row: RowRecord) -> Policy | None:
    v = row.value
    if not isinstance(v, dict) or frozenset(v) - {ERASE_MEMORIES} != _FIELDS or v.get("op") != "policy" \
            or not isinstance(v.get(ERASE_MEMORIES, False), bool):
        log.debug("ignoring retention row %s of entry %s: not a policy row", row.key, row.entry_id)
        return None
    try:
        p = policy_value(v["days"], v["compress_after"], v["success_x"], v["failure_x"], v["keep_promoted_evidence"],
                         v.get(ERASE_MEMORIES, False))
    except PolicyError as exc:
        log.debug("ignoring retention row %s of entry %s: %s", row.key, row.entry_id, exc)
        return None
    return Policy(p.days, p.compress_after, p.success_x, p.failure_x, p.keep_promoted_evidence,
                  p.erase_retired_memories, entry=row.entry_id, by=row.author)


def policy_in_force(db: Database) -> Policy | None:
    """The newest counting policy row (T order), or None."""
    out = None
    for row in db.rows(RETENTION_STORE):
        policy = _parse(row)
        if policy is None:
            continue
        past = db.settings_at(row.entry_id)
        perm = past.permission(row.author) if past is not None else None
        if perm is None or perm.level != ADMIN:
            log.debug("retention policy in entry %s does not count: %s is not an admin there", row.entry_id, row.author)
            continue
        out = policy
    return out


@dataclass(frozen=True, order=True)
class Forget:
    """One payload a run erases, and why."""

    entry: str
    store: str
    reason: str  # "compressed" | "episode" | "memory" | "vector"
    author: str


def _covered(db: Database) -> dict[str, list[tuple[int, int]]]:
    """Per session, the seq ranges level-1 chunks cover."""
    out: dict[str, list[tuple[int, int]]] = {}
    for row in db.rows(CHUNKS_STORE):
        v = row.value
        if not isinstance(v, dict) or v.get("level") != 1:
            continue
        session, a, b = v.get("session"), v.get("from_seq"), v.get("to_seq")
        if isinstance(session, str) and type(a) is int and type(b) is int and a <= b:
            out.setdefault(session, []).append((a, b))
    return out


def _compressions(db: Database, policy: Policy, now: int) -> list[Forget]:
    if policy.compress_after is None:
        return []
    cutoff = now - policy.compress_after * DAY_MS
    covered = _covered(db)
    compressible: dict[str, bool] = {}  # text hash -> every turn referencing it may lose it
    for row in db.rows(HISTORY_STORE):
        v = row.value
        if not isinstance(v, dict) or not isinstance(v.get("text"), str):
            continue
        session, seq = v.get("session"), v.get("seq")
        ok = (row.ts < cutoff and isinstance(session, str) and type(seq) is int
              and any(a <= seq <= b for a, b in covered.get(session, ())))
        h = v["text"]
        compressible[h] = compressible.get(h, True) and ok
    by_entry: dict[str, tuple[str, bool]] = {}  # entry -> (author, every text in it compressible)
    for row in db.rows(HISTORY_TEXT_STORE):
        v = row.value
        h = v.get("hash") if isinstance(v, dict) else None
        ok = isinstance(h, str) and compressible.get(h, False)
        author, prev = by_entry.get(row.entry_id, (row.author, True))
        by_entry[row.entry_id] = (author, prev and ok)
    return [Forget(entry, HISTORY_TEXT_STORE, "compressed", author)
            for entry, (author, ok) in by_entry.items() if ok]


def _promoted(db: Database) -> tuple[set[tuple[str, tuple[str, ...]]], set[str]]:
    """The promoted methods that count (node/episodes/methods.py): their (kind, sequence) and the
    episodes recorded as their evidence."""
    from memmesh.node.episodes.methods import promoted

    methods = promoted(db)
    return {(m.kind, tuple(m.sequence)) for m in methods}, {e for m in methods for e in m.evidence}


def _tools(v: dict[str, Any]) -> tuple[str, ...]:
    steps = v.get("steps")
    if not isinstance(steps, list):
        return ()
    return tuple(s["tool"] for s in steps if isinstance(s, dict) and isinstance(s.get("tool"), str))


def _forgotten_episodes(db: Database, policy: Policy, now: int) -> list[Forget]:
    promoted, evidence = _promoted(db) if policy.keep_promoted_evidence else (set(), set())
    by_entry: dict[str, tuple[str, bool]] = {}
    for row in db.rows(EPISODES_STORE):
        v = row.value
        if not isinstance(v, dict):
            continue
        outcome = v.get("outcome")
        factor = policy.success_x if outcome == "success" else policy.failure_x if outcome == "failure" else 1.0
        old = now - row.ts > policy.days * factor * DAY_MS
        kept = v.get("checked_by") == "person" or row.entry_id in evidence or (
            outcome == "success" and (v.get("kind"), _tools(v)) in promoted)
        author, prev = by_entry.get(row.entry_id, (row.author, True))
        by_entry[row.entry_id] = (author, prev and old and not kept)
    return [Forget(entry, EPISODES_STORE, "episode", author) for entry, (author, ok) in by_entry.items() if ok]


def _retired_memories(db: Database, policy: Policy, now: int) -> list[Forget]:
    if not policy.erase_retired_memories:
        return []
    from memmesh.node.memory.forgetting import retired_payloads
    from memmesh.node.memory.rows import MEMORY_STORE

    return [Forget(t.entry, t.store, "memory" if t.store == MEMORY_STORE else "vector", t.author)
            for t in retired_payloads(db, now, policy.days * DAY_MS)]


def plan(db: Database, now: int, policy: Policy | None = None) -> list[Forget]:
    """What a run at ``now`` erases under ``policy`` (default: the one in force), sorted; the
    payloads already erased are not listed again."""
    policy = policy if policy is not None else policy_in_force(db)
    if policy is None:
        return []
    found = _compressions(db, policy, now) + _forgotten_episodes(db, policy, now) + _retired_memories(db, policy, now)
    return sorted(f for f in found if db.payload_state(f.entry, f.store) == "present")


def run(db: Database, key: SigningKey, now: int, policy: Policy | None = None) -> tuple[list[Forget], list[str]]:
    """Erase what :func:`plan` lists, in signed entries of at most ERASES_PER_ENTRY erasures
    each; returns the plan and the erase entries' ids."""
    todo = plan(db, now, policy)
    entries = []
    for i in range(0, len(todo), ERASES_PER_ENTRY):
        txn = db.transaction(key)
        for f in todo[i:i + ERASES_PER_ENTRY]:
            txn.append(ERASE, EraseOp(f.entry, f.store, f.author).value())
        entries.append(txn.commit())
    return todo, entries


def summary(found: Sequence[Forget]) -> dict[str, int]:
    return {"compressed": sum(f.reason == "compressed" for f in found),
            "episodes": sum(f.reason == "episode" for f in found),
            "memories": sum(f.reason == "memory" for f in found),
            "vectors": sum(f.reason == "vector" for f in found)}
