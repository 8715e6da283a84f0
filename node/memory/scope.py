"""Scope precedence in auto-recall: when one memory key is in several stores, the closest wins.

Closest first: the agent's own memory, then the banks attached to the session (attachments
made for that session), then the agent's default banks (config.yaml ``default_memory_banks``)
in config order, then every other bank auto-recall searches, in attachment order. This decides
the order of the stores, and so of the block's lines; it never adds or removes a store from
the set auto-recall searches.
"""
from __future__ import annotations

from collections.abc import Sequence


def by_precedence(bank_ids: Sequence[str], session_ids: Sequence[str], default_ids: Sequence[str]) -> list[str]:
    """``bank_ids`` (the banks searched, without the agent's own database) closest first."""
    session, default = set(session_ids), {db_id: i for i, db_id in enumerate(default_ids)}

    def rank(db_id: str) -> tuple[int, int]:
        if db_id in session:
            return (0, 0)
        if db_id in default:
            return (1, default[db_id])
        return (2, 0)

    return sorted(bank_ids, key=rank)  # stable: banks of one rank keep their order
