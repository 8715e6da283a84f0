"""Near-duplicates on save: is a new key's memory already in the bank under another key?

``remember`` with a key the bank has no current row for asks :func:`find_duplicate` whether a
current memory of the same bank already says it (docs/memory.md, "Near-duplicates"):

* **the same text**: its value equals the new value after
  :func:`node.memory.rows.normalized_value` (whitespace runs collapsed, ends stripped, case
  folded), whatever the embedder, with or without one;
* **similar**: the cosine of its vector with the new memory's vector (``key + " " + value``, the
  vector ``remember`` writes anyway, in the active ``embeddings:<provider>/<model>`` store) is at
  or above that store's duplicate threshold. Only a store listed in :data:`THRESHOLDS` has one:
  with another embedder (another model, a remote API, another hashed dimension) or none, only
  the same text counts.

Not a duplicate: a superseded row (only current rows count), a row retired by its ``valid_to``,
a row hidden by a quarantine, a row of another bank, and a key the call itself supersedes.

The thresholds come from bench/dedup.py on its own generated paraphrase set
(bench/dedup_data.py: pairs stating one fact in other words, against pairs of different facts
on the same topic): per store, the lowest threshold, on a grid of 0.01, from which every higher
one is right about at least 95 % of the pairs it calls duplicates (precision >= 0.95 on that
set). A test checks the hashed embedder's value is what the fit gives.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from .rows import Memory, MemoryInputError
from .view import MemoryView

__all__ = ["CHOICES", "THRESHOLDS", "Duplicate", "check_choice", "find_duplicate", "threshold_for"]

CHOICES: tuple[str, ...] = ("merge", "supersede", "create")
SIMILAR_CANDIDATES = 8  # nearest current vectors looked at (the first that qualifies answers)

# embeddings store -> the cosine from which a memory is a near-duplicate (bench/dedup.py).
THRESHOLDS: dict[str, float] = {
    "embeddings:local/all-minilm-l6-v2-int8": 0.71,
    "embeddings:hashed/hashed-v1-384": 0.65,
}


def threshold_for(store: str | None) -> float | None:
    """The duplicate threshold of the embedder whose vectors live in ``store``; None (only the
    same text counts) for a store without a calibration, or no embedder."""
    if store is None:
        return None
    return THRESHOLDS.get(store)


def check_choice(value: Any) -> str | None:
    """``on_duplicate``: None, or one of :data:`CHOICES`; MemoryInputError otherwise."""
    if value is None or (isinstance(value, str) and value in CHOICES):
        return value
    raise MemoryInputError(f"on_duplicate should be 'merge', 'supersede' or 'create' (got {value!r})")


@dataclass(frozen=True)
class Duplicate:
    memory: Memory
    why: str  # "same text" or "similar"
    similarity: float  # the cosine; 1.0 for the same text

    def to_dict(self) -> dict[str, Any]:
        m = self.memory
        return {"key": m.key, "value": m.value, "entry": m.entry_id, "written_by": m.author,
                "similarity": round(self.similarity, 4), "why": self.why}


def _counts(view: MemoryView, m: Memory, now: int, skip: Collection[str]) -> bool:
    """Whether a current row may be called a duplicate (the module docstring's exclusions)."""
    if m.key in skip or (m.valid_to is not None and m.valid_to <= now):
        return False
    return not view.labels(m)[1]  # not quarantined


def find_duplicate(view: MemoryView, value: str, vector: np.ndarray | None, *, now: int,
                   skip: Collection[str] = ()) -> Duplicate | None:
    """The current memory of ``view`` that already says ``value`` (its vector ``vector``, None
    when it has none): the newest with the same text, else the most similar at or above the
    store's threshold; None if there is none. ``skip``: keys that never count (the new key,
    the keys the call supersedes)."""
    for m in view.saying(value):  # current rows, newest first
        if _counts(view, m, now, skip):
            return Duplicate(m, "same text", 1.0)
    threshold = threshold_for(view.embedding_store)
    if threshold is None or vector is None:
        return None
    for m, cos in view.nearest(vector, SIMILAR_CANDIDATES):
        if cos < threshold:
            break
        if _counts(view, m, now, skip):
            return Duplicate(m, "similar", cos)
    return None


