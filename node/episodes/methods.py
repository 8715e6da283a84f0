"""Methods learned from checked episodes, by fixed thresholds; promotions that freeze them.

Learning (:func:`learn`) is a pure function of the database's rows, so every replica holding the
same entries gets the same candidates, byte for byte, without writing anything:

* an episode *counts* when it is checked (``checked_by`` tool, test, check or person), no active
  quarantine of the agent DB covers its author and entry time, and its text is not flagged by
  the instruction detector (node/memory/hygiene.py);
* counting episodes are grouped by kind. A group yields a candidate when it has at least
  ``MIN_CHECKED`` (5) episodes, at least ``MIN_SUCCESSES`` (3) of them successes, and one tool
  sequence (the ordered tool names of the steps) behind at least 60 % of those successes,
  compared in integers (``5 * top >= 3 * successes``). Ties between sequences: the one that
  sorts first (tuples of str, by code point);
* confidence = successes with that sequence / counting episodes of the kind (a float from one
  IEEE division of two integers: the same on every replica).

A method's id is ``method:`` and the first 24 hex digits of the SHA-256 of
``json.dumps([kind, sequence])`` (no spaces): the same kind and sequence are the same method
everywhere.

Promotion is a row of the ``methods`` store, ``{"op": "promote", "method": {...}}`` holding the
candidate as it was (kind, sequence, counts, confidence, evidence: the ids of the successes with
the sequence, at most ``MAX_EVIDENCE`` in T order). It counts when its author held Admin in the
entry's causal past (``Database.settings_at``): any writer can put a row in the store, only an
admin's freezes anything. Of an entry only the first well-formed row is read; of two promotions
of one method, the first in T order. A promoted method is frozen: it is listed as stored, and
learning skips its kind (no candidate there is ever computed again, so nothing rewrites or demotes
it, whatever episodes arrive later).
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from memmesh.auth.permissions import ADMIN
from memmesh.crdt.database import Database, RowRecord
from memmesh.node.memory.quarantine import Quarantine, quarantines
from memmesh.node.memory.rows import MemoryInputError, check_slug
from memmesh.node.memory.timeline import check_entry_id

from .record import MAX_STEPS, MAX_TOOL_CHARS, Episode, episodes, exclusion

__all__ = ["MAX_EVIDENCE", "METHODS_STORE", "MIN_CHECKED", "MIN_SUCCESSES", "KindReport", "Learned", "Method",
           "Promotion", "learn", "method_id", "promote_value", "promoted"]

log = logging.getLogger(__name__)

METHODS_STORE = "methods"
MIN_CHECKED = 5
MIN_SUCCESSES = 3
SHARE_NUM, SHARE_DEN = 3, 5  # 60 %, compared in integers
MAX_EVIDENCE = 1000


def method_id(kind: str, sequence: Sequence[str]) -> str:
    digest = hashlib.sha256(json.dumps([kind, list(sequence)], separators=(",", ":"), ensure_ascii=False)
                            .encode()).hexdigest()
    return "method:" + digest[:24]


@dataclass(frozen=True)
class Promotion:
    entry: str  # the entry holding the promote row
    by: str  # the admin key that signed it
    ts: int


@dataclass(frozen=True)
class Method:
    id: str
    kind: str
    sequence: tuple[str, ...]
    checked: int  # counting (checked, not quarantined, not flagged) episodes of the kind
    successes: int  # of them, successes
    with_sequence: int  # of the successes, those whose tool sequence is this one
    confidence: float  # with_sequence / checked
    evidence: tuple[str, ...] = ()  # ids of the successes with the sequence (at most MAX_EVIDENCE)
    promotion: Promotion | None = None

    @property
    def promoted(self) -> bool:
        return self.promotion is not None

    def stored(self) -> dict[str, Any]:
        """The method as a promote row holds it."""
        return {"id": self.id, "kind": self.kind, "sequence": list(self.sequence), "checked": self.checked,
                "successes": self.successes, "with_sequence": self.with_sequence, "confidence": self.confidence,
                "evidence": list(self.evidence)}

    def to_dict(self) -> dict[str, Any]:
        p = self.promotion
        return {**self.stored(), "promoted": p is not None,
                "promotion": None if p is None else {"entry": p.entry, "by": p.by, "ts": p.ts}}


@dataclass(frozen=True)
class KindReport:
    """What learning found for one kind: the counts, and why it is (not) a candidate."""

    kind: str
    episodes: int  # every episode of the kind
    checked: int  # counting episodes
    successes: int
    left_out: dict[str, int]  # unchecked, quarantined, flagged (each episode under its first reason)
    top_sequence: tuple[str, ...] | None  # the sequence behind most successes
    top_count: int
    status: str  # "candidate" | "promoted" (frozen) | "short" (below a threshold)
    why: str  # one line for people

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "episodes": self.episodes, "checked": self.checked, "successes": self.successes,
                "left_out": dict(self.left_out), "top_sequence": None if self.top_sequence is None else
                list(self.top_sequence), "top_count": self.top_count, "status": self.status, "why": self.why}


@dataclass(frozen=True)
class Learned:
    kinds: list[KindReport] = field(default_factory=list)  # sorted by kind
    candidates: list[Method] = field(default_factory=list)  # sorted by kind
    promoted: list[Method] = field(default_factory=list)  # T order of their promotions

    def methods(self) -> list[Method]:
        """Promoted methods, then candidates."""
        return [*self.promoted, *self.candidates]

    def find(self, mid: str) -> Method | None:
        return next((m for m in self.methods() if m.id == mid), None)

    def for_kind(self, kind: str) -> list[Method]:
        return [m for m in self.methods() if m.kind == kind]


# ---------------------------------------------------------------------------------- promotions
def promote_value(method: Method) -> dict[str, Any]:
    """The ``methods`` row that promotes ``method`` (a candidate as :func:`learn` computed it)."""
    return {"op": "promote", "method": method.stored()}


def _count(v: Any) -> int:
    if type(v) is not int or v < 0:
        raise MemoryInputError("a count is not a whole number >= 0")
    return v


def _parse(row: RowRecord) -> Method | None:
    v = row.value
    try:
        if not isinstance(v, dict) or v.get("op") != "promote" or not isinstance(v.get("method"), dict):
            raise MemoryInputError('not {"op": "promote", "method": {...}}')
        m = v["method"]
        kind = check_slug("kind", m.get("kind"))
        seq = m.get("sequence")
        if (not isinstance(seq, list) or not 1 <= len(seq) <= MAX_STEPS
                or not all(isinstance(t, str) and 1 <= len(t) <= MAX_TOOL_CHARS for t in seq)):
            raise MemoryInputError("sequence is not a list of tool names")
        checked, successes, with_seq = _count(m.get("checked")), _count(m.get("successes")), _count(m.get("with_sequence"))
        if not with_seq <= successes <= checked:
            raise MemoryInputError("the counts do not nest (with_sequence <= successes <= checked)")
        conf = m.get("confidence")
        if type(conf) not in (int, float) or not 0 <= conf <= 1:
            raise MemoryInputError("confidence is not a number from 0 to 1")
        evidence: tuple[str, ...] = ()
        raw = m.get("evidence")
        if isinstance(raw, list) and len(raw) <= MAX_EVIDENCE:
            try:
                evidence = tuple(check_entry_id("evidence", e) for e in raw)
            except MemoryInputError:
                log.debug("dropping the evidence of methods row %s in entry %s: not entry ids", row.key, row.entry_id)
        return Method(method_id(kind, seq), kind, tuple(seq), checked, successes, with_seq, float(conf), evidence,
                      Promotion(row.entry_id, row.author, row.ts))
    except MemoryInputError as exc:
        log.debug("ignoring methods row %s of entry %s: %s", row.key, row.entry_id, exc)
        return None


def promoted(db: Database) -> list[Method]:
    """Every promotion of ``db`` that counts (its signer held Admin in the entry's past), in T order."""
    out: dict[str, Method] = {}
    read: set[str] = set()
    for row in db.rows(METHODS_STORE):
        if row.entry_id in read:
            continue
        m = _parse(row)
        if m is None:
            continue
        read.add(row.entry_id)
        past = db.settings_at(row.entry_id)
        held = past.permission(row.author) if past is not None else None
        if held is None or held.level != ADMIN:
            log.debug("promotion in entry %s does not count: %s holds %s there, not admin", row.entry_id,
                      row.author, held)
            continue
        out.setdefault(m.id, m)  # the first promotion of a method is the one that froze it
    return list(out.values())


# ---------------------------------------------------------------------------------- learning
def _report(kind: str, eps: list[Episode], qs: Sequence[Quarantine], frozen: bool) -> tuple[KindReport, Method | None]:
    left_out = {"unchecked": 0, "quarantined": 0, "flagged": 0}
    counting: list[Episode] = []
    for ep in eps:
        why = exclusion(ep, qs)
        if why is None and not ep.checked:
            why = "unchecked"
        if why is None:
            counting.append(ep)
        else:
            left_out[why] += 1
    wins = [ep for ep in counting if ep.outcome == "success"]
    seqs = Counter(ep.sequence for ep in wins)
    top, top_count = (None, 0)
    if seqs:
        # Most successes first; among equals the sequence that sorts first.
        top, top_count = min(seqs.items(), key=lambda kv: (-kv[1], kv[0]))
    checked, successes = len(counting), len(wins)
    method = None
    if frozen:
        status, why = "promoted", "a promoted method is frozen: learning leaves this kind alone"
    elif checked < MIN_CHECKED:
        status, why = "short", f"{checked} checked episode{'s' * (checked != 1)} ({MIN_CHECKED} needed)"
    elif successes < MIN_SUCCESSES:
        status, why = "short", f"{successes} success{'es' * (successes != 1)} among them ({MIN_SUCCESSES} needed)"
    elif SHARE_DEN * top_count < SHARE_NUM * successes:
        status, why = "short", (f"the most common tool sequence is behind {top_count} of {successes} successes "
                                f"({SHARE_NUM * 100 // SHARE_DEN} % needed)")
    else:
        assert top is not None
        status, why = "candidate", f"{top_count} of {successes} successes used this sequence"
        evidence = tuple(ep.id for ep in wins if ep.sequence == top)[:MAX_EVIDENCE]
        method = Method(method_id(kind, top), kind, top, checked, successes, top_count, top_count / checked, evidence)
    return KindReport(kind, len(eps), checked, successes, left_out, top, top_count, status, why), method


def learn(db: Database, eps: list[Episode] | None = None, qs: list[Quarantine] | None = None,
          frozen: list[Method] | None = None) -> Learned:
    """The candidate methods of ``db`` and its promoted ones (``eps``, ``qs``, ``frozen``: what
    :func:`episodes`, :func:`quarantines` and :func:`promoted` return, when the caller has them)."""
    eps = episodes(db) if eps is None else eps
    qs = quarantines(db) if qs is None else qs
    frozen = promoted(db) if frozen is None else frozen
    frozen_kinds = {m.kind for m in frozen}
    by_kind: dict[str, list[Episode]] = {}
    for ep in eps:
        by_kind.setdefault(ep.kind, []).append(ep)
    reports, candidates = [], []
    for kind in sorted(by_kind):
        report, method = _report(kind, by_kind[kind], qs, kind in frozen_kinds)
        reports.append(report)
        if method is not None:
            candidates.append(method)
    return Learned(reports, candidates, list(frozen))
