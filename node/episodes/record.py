"""Task episodes and their verdicts: the row shapes, strict local input, lenient remote parsing.

Two stores of the agent's database (append-only, signed like every row; docs/memory.md,
"Episodes and methods"). The row shapes, exactly:

    episodes:          {"kind": SLUG, "steps": [{"tool": T, "status": "ok"|"error"|"skipped",
                        "note"?: N}, ...], "outcome": "success"|"failure"|"unknown",
                        "checked_by": "tool"|"test"|"check"|"person"|"none", "summary"?: S}
    episode_verdicts:  {"episode": ENTRY_ID, "verdict": "yes"|"no"|"unsure", "reason"?: R}

An episode's id is the id of the entry that holds it, and so is a verdict's: the local writers
put one row in an entry, and of a received entry only its first well-formed row of each store is
read. The author of either is its entry's author (``RowRecord.author``): a verdict is signed by
whoever gives it, and never changes the episode's own outcome or ``checked_by``.

Local input is strict (:class:`EpisodeInputError`, nothing written). Remote rows are parsed
leniently: a row whose required fields are malformed is ignored, a malformed optional field
(``note``, ``summary``, ``reason``) is dropped and the rest kept, unknown fields are ignored
(logged at debug); reading a stored row never raises.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memmesh.auth.errors import MemmeshError
from memmesh.auth.keys import SigningKey
from memmesh.crdt.database import Database, RowRecord
from memmesh.node.memory.hygiene import detect
from memmesh.node.memory.quarantine import Quarantine, hides
from memmesh.node.memory.rows import MemoryInputError, check_slug
from memmesh.node.memory.timeline import check_entry_id

__all__ = [
    "CHECKED_BY",
    "CHECKERS",
    "EPISODES_STORE",
    "MAX_NOTE_CHARS",
    "MAX_REASON_CHARS",
    "MAX_STEPS",
    "MAX_SUMMARY_CHARS",
    "MAX_TOOL_CHARS",
    "OUTCOMES",
    "STATUSES",
    "VERDICTS",
    "VERDICTS_STORE",
    "Episode",
    "EpisodeInputError",
    "Step",
    "Verdict",
    "check_kind",
    "counts",
    "episode_value",
    "episodes",
    "exclusion",
    "parse_episode",
    "parse_verdict",
    "verdict_value",
    "verdicts",
    "write_episode",
    "write_verdict",
]

log = logging.getLogger(__name__)

EPISODES_STORE = "episodes"
VERDICTS_STORE = "episode_verdicts"
OUTCOMES = ("success", "failure", "unknown")
CHECKED_BY = ("tool", "test", "check", "person", "none")
CHECKERS = ("tool", "test", "check", "person")  # what makes an episode checked
STATUSES = ("ok", "error", "skipped")
VERDICTS = ("yes", "no", "unsure")
MAX_STEPS = 64
MAX_TOOL_CHARS = 128
MAX_NOTE_CHARS = 500
MAX_SUMMARY_CHARS = 2000
MAX_REASON_CHARS = 1000


class EpisodeInputError(MemmeshError):
    """An episode or verdict refused before anything is written; the message says what to change."""


@dataclass(frozen=True)
class Step:
    tool: str
    status: str  # ok | error | skipped
    note: str | None = None


@dataclass(frozen=True)
class Episode:
    id: str  # the id of the entry that holds it
    kind: str
    steps: tuple[Step, ...]
    outcome: str
    checked_by: str
    summary: str | None
    author: str
    ts: int  # the entry's signed timestamp (ms)

    @property
    def checked(self) -> bool:
        """Whether a tool, a test, a check or a person decided the outcome (not the model)."""
        return self.checked_by in CHECKERS

    @property
    def sequence(self) -> tuple[str, ...]:
        """The tool names of the steps, in order: what a learned method is."""
        return tuple(s.tool for s in self.steps)

    def text_parts(self) -> list[str]:
        """Every piece of text the episode carries (kind, tool names, notes, summary)."""
        parts = [self.kind, *self.sequence, *(s.note for s in self.steps if s.note)]
        return parts + ([self.summary] if self.summary else [])

    def flag(self) -> str | None:
        """The hygiene rule the episode's text matches, or None. The parts are joined by line
        breaks, so an instruction split over two fields (or a fake turn starting one) is caught."""
        return detect("\n".join(self.text_parts()))

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "outcome": self.outcome, "checked_by": self.checked_by,
                "checked": self.checked, "summary": self.summary, "by": self.author, "ts": self.ts,
                "steps": [{"tool": s.tool, "status": s.status, **({"note": s.note} if s.note else {})}
                          for s in self.steps]}


@dataclass(frozen=True)
class Verdict:
    id: str  # the id of the entry that holds it
    episode: str
    verdict: str  # yes | no | unsure
    reason: str | None
    author: str  # who gave it: the key that signed it
    ts: int

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "episode": self.episode, "verdict": self.verdict, "reason": self.reason,
                "by": self.author, "ts": self.ts}


# ---------------------------------------------------------------------------------- strict input
def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _text(what: str, value: Any, most: int, least: int = 1) -> str:
    if not isinstance(value, str) or not least <= len(value) <= most:
        raise EpisodeInputError(f"{what} must be text of {least}-{most} characters, got {_shown(value)}")
    return value


def _choice(what: str, value: Any, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise EpisodeInputError(f"{what} must be one of {', '.join(choices)}, got {_shown(value)}")
    return value


def _kind(value: Any) -> str:
    try:
        return check_slug("kind", value)
    except MemoryInputError as exc:
        raise EpisodeInputError(f"the episode's {exc} (e.g. deploy-service)") from None


def _step(i: int, raw: Any) -> dict[str, Any]:
    if isinstance(raw, Step):
        raw = {"tool": raw.tool, "status": raw.status, **({"note": raw.note} if raw.note is not None else {})}
    if not isinstance(raw, Mapping):
        raise EpisodeInputError(f'step {i} must be an object {{"tool": ..., "status": ok|error|skipped, '
                                f'"note"?: ...}}, got {_shown(raw)}')
    unknown = sorted(str(k) for k in raw if k not in ("tool", "status", "note"))
    if unknown:
        raise EpisodeInputError(f"step {i} has unknown field(s) {', '.join(unknown)}; a step has tool, status, note")
    out = {"tool": _text(f"step {i}'s tool", raw.get("tool"), MAX_TOOL_CHARS),
           "status": _choice(f"step {i}'s status", raw.get("status"), STATUSES)}
    if raw.get("note") is not None:
        out["note"] = _text(f"step {i}'s note", raw["note"], MAX_NOTE_CHARS)
    return out


def episode_value(kind: str, steps: Sequence[Any], outcome: str, checked_by: str,
                  summary: str | None = None) -> dict[str, Any]:
    """The ``episodes`` row for these fields; EpisodeInputError if any is malformed. ``steps``:
    :class:`Step` objects or mappings with tool, status and an optional note."""
    if isinstance(steps, (str, bytes, Mapping)) or not isinstance(steps, Sequence):
        raise EpisodeInputError(f"steps must be a list of 1-{MAX_STEPS} steps, got {_shown(steps)}")
    if not 1 <= len(steps) <= MAX_STEPS:
        raise EpisodeInputError(f"an episode has 1-{MAX_STEPS} steps (the tools that ran, in order), got {len(steps)}")
    value: dict[str, Any] = {"kind": _kind(kind), "steps": [_step(i + 1, s) for i, s in enumerate(steps)],
                             "outcome": _choice("outcome", outcome, OUTCOMES),
                             "checked_by": _choice("checked_by", checked_by, CHECKED_BY)}
    if summary is not None:
        value["summary"] = _text("summary", summary, MAX_SUMMARY_CHARS)
    return value


def verdict_value(episode: str, verdict: str, reason: str | None = None) -> dict[str, Any]:
    """The ``episode_verdicts`` row; EpisodeInputError if a field is malformed."""
    try:
        episode = check_entry_id("episode", episode)
    except MemoryInputError as exc:
        raise EpisodeInputError(f"{exc} (memmesh episode list AGENT shows the ids)") from None
    value = {"episode": episode, "verdict": _choice("verdict", verdict, VERDICTS)}
    if reason is not None:
        value["reason"] = _text("reason", reason, MAX_REASON_CHARS)
    return value


def _write(db: Database, key: SigningKey, store: str, value: dict[str, Any]) -> str:
    txn = db.transaction(key)  # refuses a key that may not write, before anything is signed
    txn.append(store, value)
    return txn.commit()


def write_episode(db: Database, key: SigningKey, value: dict[str, Any]) -> str:
    """Write one episode row (from :func:`episode_value`) in its own entry; its id."""
    return _write(db, key, EPISODES_STORE, value)


def write_verdict(db: Database, key: SigningKey, value: dict[str, Any]) -> str:
    """Write one verdict row (from :func:`verdict_value`) in its own entry, signed by ``key``."""
    return _write(db, key, VERDICTS_STORE, value)


# ---------------------------------------------------------------------------------- lenient reading
def _optional(row: RowRecord, v: Mapping[str, Any], name: str, most: int) -> str | None:
    raw = v.get(name)
    if raw is None:
        return None
    if isinstance(raw, str) and 1 <= len(raw) <= most:
        return raw
    log.debug("dropping %s of %s row %s in entry %s: not text of 1-%d characters", name, row.store, row.key,
              row.entry_id, most)
    return None


def parse_episode(row: RowRecord) -> Episode | None:
    """The episode an ``episodes`` row holds, or None (logged at debug) if it is malformed."""
    v = row.value
    try:
        if not isinstance(v, dict):
            raise EpisodeInputError("the value is not an object")
        steps_raw = v.get("steps")
        if not isinstance(steps_raw, list) or not 1 <= len(steps_raw) <= MAX_STEPS:
            raise EpisodeInputError(f"steps is not a list of 1-{MAX_STEPS} steps")
        steps = []
        for i, s in enumerate(steps_raw):
            if not isinstance(s, dict):
                raise EpisodeInputError(f"step {i + 1} is not an object")
            tool = _text(f"step {i + 1}'s tool", s.get("tool"), MAX_TOOL_CHARS)
            status = _choice(f"step {i + 1}'s status", s.get("status"), STATUSES)
            note = s.get("note")
            steps.append(Step(tool, status, note if isinstance(note, str) and 1 <= len(note) <= MAX_NOTE_CHARS
                              else None))
        return Episode(row.entry_id, _kind(v.get("kind")), tuple(steps), _choice("outcome", v.get("outcome"), OUTCOMES),
                       _choice("checked_by", v.get("checked_by"), CHECKED_BY),
                       _optional(row, v, "summary", MAX_SUMMARY_CHARS), row.author, row.ts)
    except EpisodeInputError as exc:
        log.debug("ignoring episodes row %s of entry %s: %s", row.key, row.entry_id, exc)
        return None


def parse_verdict(row: RowRecord) -> Verdict | None:
    """The verdict an ``episode_verdicts`` row holds, or None (logged at debug) if malformed."""
    v = row.value
    try:
        if not isinstance(v, dict):
            raise EpisodeInputError("the value is not an object")
        try:
            episode = check_entry_id("episode", v.get("episode"))
        except MemoryInputError as exc:
            raise EpisodeInputError(str(exc)) from None
        return Verdict(row.entry_id, episode, _choice("verdict", v.get("verdict"), VERDICTS),
                       _optional(row, v, "reason", MAX_REASON_CHARS), row.author, row.ts)
    except EpisodeInputError as exc:
        log.debug("ignoring episode_verdicts row %s of entry %s: %s", row.key, row.entry_id, exc)
        return None


def episodes(db: Database) -> list[Episode]:
    """Every episode of ``db`` in T order: the first well-formed row of each entry."""
    out: list[Episode] = []
    seen: set[str] = set()
    for row in db.rows(EPISODES_STORE):
        if row.entry_id in seen:
            continue
        ep = parse_episode(row)
        if ep is not None:
            seen.add(row.entry_id)
            out.append(ep)
    return out


def verdicts(db: Database) -> dict[str, list[Verdict]]:
    """Episode id -> its verdicts in T order (the first well-formed row of each entry). A verdict
    whose episode this replica does not hold (yet) is kept under that id all the same."""
    out: dict[str, list[Verdict]] = {}
    seen: set[str] = set()
    for row in db.rows(VERDICTS_STORE):
        if row.entry_id in seen:
            continue
        v = parse_verdict(row)
        if v is not None:
            seen.add(row.entry_id)
            out.setdefault(v.episode, []).append(v)
    return out


def exclusion(ep: Episode, qs: Sequence[Quarantine]) -> str | None:
    """Why an episode never counts for learning or planning ("quarantined", "flagged"), or None.
    An unchecked episode is shown to a planner but not learned from: see :func:`counts`."""
    if hides(qs, ep.author, ep.ts):
        return "quarantined"
    if ep.flag() is not None:
        return "flagged"
    return None


def counts(ep: Episode, qs: Sequence[Quarantine]) -> bool:
    """Whether the episode counts for learning: checked, not quarantined, not flagged."""
    return ep.checked and exclusion(ep, qs) is None


def check_kind(kind: str) -> str:
    """A kind as episodes name it (a lowercase slug); EpisodeInputError otherwise."""
    return _kind(kind)

