"""What every replica derives about a memory row from its signed content: its labels.

Trust in recall (docs/memory.md, "Trust tiers") rests on facts no writer can declare for
itself: who signed the row (its entry's author), the row's ``source`` field, what the
instruction detector (:mod:`node.memory.hygiene`) and the credential scanner
(:mod:`node.memory.secrets`) find in its text, and the bank's quarantines
(:mod:`node.memory.quarantine`). The first three are functions of the row alone, computed once
when a row is indexed; quarantines change as entries arrive and are applied per query.

A row's **tier** for a reading agent, the first that applies:

* ``quarantined``: an active quarantine of the bank covers its writer and time;
* ``flagged``: its key or value reads like an instruction to the assistant;
* ``ingested``: its ``source`` is ``ingested`` or ``tool`` (text the agent took in, not wrote);
* ``derived``: its ``source`` is ``derived``: a fact the auto-capture rules took from what a user
  said (node/memory/capture.py), saved without the user asking (or accepted from a proposal);
* ``owner``: written by the reading agent's own key;
* ``peer``: written by another key.

A **secret** (a ``contains-secrets`` tag, or a credential the scanner finds) is not a tier but a
filter: such rows are never embedded, never auto-recalled, and returned by recall only when the
reading agent's config says ``include_secrets``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .hygiene import RULES, detect
from .rows import Memory
from .secrets import secret_reason

__all__ = ["DERIVED_SOURCE", "INGESTED_SOURCES", "Labels", "TIERS", "labels_of", "row_labels", "tier"]

INGESTED_SOURCES = ("ingested", "tool")
DERIVED_SOURCE = "derived"
TIERS = ("owner", "derived", "peer", "ingested", "flagged", "quarantined")
NO_FLAG = -1
FLAG_NAMES: tuple[str, ...] = RULES


@dataclass(frozen=True, slots=True)
class Labels:
    flag: str | None  # the hygiene rule that matched, or None
    secret: str | None  # "tagged", the scanner's credential type, or None
    ingested: bool
    derived: bool = False  # source "derived" (auto-capture); a view that keeps no such column passes False

    @property
    def flag_id(self) -> int:
        return NO_FLAG if self.flag is None else FLAG_NAMES.index(self.flag)


def labels_of(key: str, value: str, tags: Sequence[str], source: str | None) -> Labels:
    """The labels of a row with this content (for a row about to be written, too)."""
    return Labels(detect(f"{key}\n{value}"), secret_reason(key, value, tags), source in INGESTED_SOURCES,
                  source == DERIVED_SOURCE)


def row_labels(m: Memory) -> Labels:
    return labels_of(m.key, m.value, m.tags, m.source)


def tier(author: str, labels: Labels, reader: str | None, quarantined: bool) -> str:
    """The row's trust tier for the agent whose public key is ``reader`` (None: no reader, so
    every row not in a lower tier is ``peer``)."""
    if quarantined:
        return "quarantined"
    if labels.flag is not None:
        return "flagged"
    if labels.ingested:
        return "ingested"
    if labels.derived:
        return "derived"
    return "owner" if reader is not None and author == reader else "peer"
