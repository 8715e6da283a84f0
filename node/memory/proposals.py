"""Proposed memories: what auto-capture found in a user's turn, kept until accepted or dropped.

Where they are kept: the ``proposals`` store of the agent's own database, as signed rows. The
turn they come from is already there (the ``history`` store), so a proposal reveals nothing the
database did not hold; a proposal made on one replica of the agent can be accepted on another;
and an accept or a drop is recorded once, signed, so two replicas never both save a fact, nor
propose again a fact the user dropped. A peer-local store would have none of this.

Rows, in T order (the same fold on every replica):

* ``{"op": "propose", "id", "key", "value", "rule", "sentence", "session", "turn"}``: a fact
  the rules of :mod:`node.memory.capture` found in the turn ``turn`` (``<entry>/<row>``);
* ``{"op": "accept", "id", "entry"}``: made a memory (``entry``: the memory's entry), or
  ``{"op": "accept", "id", "row"}`` when the memory row is in this same entry (``save`` mode);
* ``{"op": "drop", "id"}``: not wanted; the same fact is never proposed again.

A proposal's id is ``prop:`` and 16 hex digits of the SHA-256 of its key and normalised value, so
the same fact said twice is one proposal. Its state is its last row's. Rows count only when
signed by a key holding Admin on the database now (the agent's own key is its Admin(0)): a writer
granted Write on the agent's database cannot slip a proposal in for the user to accept.
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memmesh.auth.errors import MemmeshError
from memmesh.auth.keys import SigningKey
from memmesh.auth.permissions import ADMIN
from memmesh.crdt.database import Database

from .agent_config import AUTO_CAPTURE_MODES, agent_state
from .capture import Proposal, extract
from .labels import DERIVED_SOURCE
from .rows import MEMORY_STORE, memory_value, normalized_value

__all__ = ["CAPTURE_TAG", "PROPOSALS_STORE", "Pending", "capture_turn", "decision_value", "open_proposals",
           "proposal_id", "proposals"]

log = logging.getLogger(__name__)

PROPOSALS_STORE = "proposals"
CAPTURE_TAG = "auto-capture"
MAX_SENTENCE_CHARS = 500
CATEGORY = {"prefer": "preference"}  # other rules: fact


def proposal_id(key: str, value: str) -> str:
    digest = hashlib.sha256(json.dumps([key, normalized_value(value)]).encode()).hexdigest()
    return f"prop:{digest[:16]}"


@dataclass
class Pending:
    """A proposal and its state: ``open``, ``accepted`` or ``dropped``."""

    id: str
    key: str
    value: str
    rule: str
    sentence: str
    session: str
    turn: str
    ts: int  # the proposing entry's timestamp (ms)
    state: str = "open"
    entry: str | None = None  # accepted: the memory's entry

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "key": self.key, "value": self.value, "rule": self.rule, "sentence": self.sentence,
                "session": self.session, "turn": self.turn, "state": self.state, "entry": self.entry}


def _str(v: Any, limit: int = 65_536) -> str | None:
    return v if isinstance(v, str) and 0 < len(v) <= limit else None


def proposals(db: Database) -> dict[str, Pending]:
    """Every proposal of the database with its state, in the order first proposed."""
    settings = db.settings()
    admins: dict[str, bool] = {}
    out: dict[str, Pending] = {}
    for row in db.small_rows(PROPOSALS_STORE):
        v = row.value
        if not isinstance(v, dict) or not isinstance(v.get("id"), str):
            continue
        if row.author not in admins:
            held = settings.permission(row.author)
            admins[row.author] = held is not None and held.level == ADMIN
        if not admins[row.author]:
            continue
        op, pid = v.get("op"), v["id"]
        if op == "propose":
            fields = [_str(v.get(n)) for n in ("key", "value", "rule")]
            if any(f is None for f in fields) or proposal_id(str(fields[0]), str(fields[1])) != pid:
                continue
            key, value, rule = (str(f) for f in fields)
            old = out.pop(pid, None)  # proposed again after an accept: open again, listed as new
            if old is not None and old.state == "open":
                out[pid] = old
                continue
            out[pid] = Pending(pid, key, value, rule, _str(v.get("sentence")) or "", _str(v.get("session")) or "",
                               _str(v.get("turn")) or "", row.ts)
        elif op in ("accept", "drop") and pid in out:
            p = out[pid]
            p.state = "accepted" if op == "accept" else "dropped"
            entry = _str(v.get("entry"))
            p.entry = entry if entry is not None else (row.entry_id if op == "accept" else None)
    return out


def open_proposals(db: Database) -> list[Pending]:
    return [p for p in proposals(db).values() if p.state == "open"]


def decision_value(op: str, pid: str, entry: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"op": op, "id": pid}
    if entry is not None:
        out["entry"] = entry
    return out


def derived_row(p: Proposal | Pending) -> dict[str, Any]:
    """The memory row a proposal becomes: ``source: derived``, tagged ``auto-capture``."""
    return memory_value(p.key, p.value, [CAPTURE_TAG], source=DERIVED_SOURCE,
                        category=CATEGORY.get(p.rule, "fact"))


def _wanted(found: Sequence[Proposal], known: dict[str, Pending], mode: str) -> list[tuple[str, Proposal, bool]]:
    """(id, proposal, whether a propose row is needed) for each fact worth writing."""
    accepted_by_key: dict[str, str] = {}
    for p in known.values():  # the newest accepted proposal per key is the value capture last saved
        if p.state == "accepted":
            accepted_by_key[p.key] = p.id
    out = []
    for f in found:
        pid = proposal_id(f.key, f.value)
        old = known.get(pid)
        if old is not None and (old.state == "dropped" or (old.state == "open" and mode == "propose")):
            continue
        if old is not None and old.state == "accepted" and accepted_by_key.get(f.key) == pid:
            continue
        out.append((pid, f, old is None or old.state != "open"))
    return out


def capture_turn(db: Database, key: SigningKey, role: str, text: str, *, session: str, turn: str) -> dict[str, Any] | None:
    """What auto-capture does with a turn history recorded (node/history/service.py): for a user
    turn, per the agent's ``auto_capture`` config, nothing (off), proposals written (propose),
    or memories written with ``source: derived`` (save), in one signed entry. None for other
    roles. Never raises: a failed write is a warning in the result (the turn stays recorded)."""
    if role != "user":
        return None
    mode = agent_state(db).config.get("auto_capture", "propose")
    if mode not in AUTO_CAPTURE_MODES or mode == "off":
        return {"mode": "off", "proposed": [], "saved": []}
    out: dict[str, Any] = {"mode": mode, "proposed": [], "saved": []}
    try:
        found = extract(text)
        if not found:
            return out
        wanted = _wanted(found, proposals(db), mode)
        if not wanted:
            return out
        txn = db.transaction(key)
        for pid, f, propose in wanted:
            item = {"id": pid, "key": f.key, "value": f.value, "rule": f.rule}
            if propose:
                txn.append(PROPOSALS_STORE, {"op": "propose", "id": pid, "key": f.key, "value": f.value,
                                             "rule": f.rule, "sentence": f.sentence[:MAX_SENTENCE_CHARS],
                                             "session": session, "turn": turn})
            if mode == "save":
                row_key = txn.append(MEMORY_STORE, derived_row(f))
                txn.append(PROPOSALS_STORE, {"op": "accept", "id": pid, "row": row_key})
                out["saved"].append(item)
            else:
                out["proposed"].append(item)
        entry = txn.commit()
        out["entry"] = entry
    except MemmeshError as exc:
        log.warning("auto-capture of turn %s wrote nothing: %s", turn, exc)
        out = {"mode": mode, "proposed": [], "saved": [], "warnings": [f"auto-capture wrote nothing: {exc}"]}
    return out
