"""The agent tools' answers (remember, recall, list_memory_banks, neighbors, forget), and the
commands built on them (tool, remember, recall, forget, autorecall).

A memory as tools return it is node/memory/rows.py's ``Memory.to_dict`` (optional fields only
when set), with the recall's trust label, relations and access counts.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from memmesh.node.commands.answers.base import Answer, omitted

Tier = Literal["owner", "derived", "peer", "ingested", "flagged", "quarantined"]


class EdgeOut(Answer):
    type: str
    to: str
    entry: str = omitted("the entry of the row the link names, when it was resolved at write time")


class SupersededKey(Answer):
    key: str
    entry: str = omitted()


class KeyEntry(Answer):
    key: str
    entry: str


class ConflictOut(Answer):
    value: str
    entry: str
    written_by: str


class MemoryOut(Answer):
    """One memory row (node/memory/rows.py ``Memory.to_dict``)."""

    key: str
    value: str
    tags: list[str]
    time: str | None = Field(description="when it was written, ISO 8601 UTC")
    written_by: str = Field(description="the author's public key (ed25519:...)")
    entry: str
    bank: str | None
    category: str = omitted()
    confidence: int = omitted()
    importance: int = omitted()
    source: str = omitted()
    entities: list[str] = omitted()
    edges: list[EdgeOut] = omitted("its links, but supersedes")
    valid_from: str | None = omitted()
    valid_to: str | None = omitted()
    supersedes: list[SupersededKey] = omitted()


class RecalledMemory(MemoryOut):
    trust: Tier
    flagged: str = omitted("the hygiene rule it matched")
    secret: str = omitted("why it holds a secret")
    superseded_by: KeyEntry = omitted("the newer row of its key, when it is not current")
    conflicts: list[ConflictOut] = omitted("rows of its key concurrent with it")
    access_count: int
    recalls: int
    injections: int
    last_access: str | None


class HistoryHit(Answer):
    """A past discussion found by recall's history scope (node/history/search.py)."""

    kind: Literal["turn", "chunk"]
    id: str
    session: str
    level: int
    seq: int = omitted("a turn's position in its session")
    from_seq: int = omitted()
    to_seq: int = omitted()
    role: str | None
    trust: str = omitted()
    written_by: str = omitted()
    text: str | None
    summary: str | None = omitted()
    by: str = omitted()
    time: str | None
    score: float
    past_discussion: bool
    flagged: str = omitted()
    secret: str = omitted()


class RecallOut(Answer):
    memories: list[RecalledMemory]
    count: int
    bank: str
    message: str
    warnings: list[str]
    history: list[HistoryHit] = omitted("with the history scope: the agent's past discussion")


class DuplicateOut(Answer):
    key: str
    value: str
    entry: str
    written_by: str
    similarity: float
    why: str


class RememberOut(Answer):
    """What remember did: saved (ok), nothing new (deduplicated), or nothing saved because the
    bank already holds it under another key (ok false, duplicate, choices)."""

    ok: bool
    key: str
    bank: str
    entry: str
    embedded: bool
    warnings: list[str]
    deduplicated: bool = omitted("the current row says the same: nothing written")
    merged_into: str = omitted()
    merged: bool = omitted()
    flagged: str = omitted()
    secret: str = omitted()
    supersedes: list[KeyEntry] = omitted("the rows it retired")
    duplicate_of: DuplicateOut = omitted()
    on_duplicate: str | None = omitted()
    duplicate: DuplicateOut = omitted("not saved: the memory that already says it")
    choices: list[str] = omitted()
    message: str = omitted()


class BankOut(Answer):
    name: str
    id: str
    kind: Literal["self", "bank"]
    permission: str | None
    self_: bool = Field(alias="self")


class ListBanksOut(Answer):
    banks: list[BankOut]
    count: int


class LinkOut(Answer):
    type: str
    direction: str
    key: str
    bank: str


class NeighborOut(MemoryOut):
    depth: int
    links: list[LinkOut]


class FromOut(Answer):
    key: str
    bank: str


class UnreachableOut(Answer):
    from_: FromOut = Field(alias="from")
    type: str
    bank: str
    key: str
    reason: str


class MissingOut(Answer):
    from_: FromOut = Field(alias="from")
    type: str
    bank: str
    key: str


class NeighborsOut(Answer):
    key: str | None
    entity: str = omitted()
    bank: str
    depth: int
    neighbors: list[NeighborOut]
    count: int
    unreachable: list[UnreachableOut]
    missing: list[MissingOut]
    truncated: bool
    message: str
    warnings: list[str]


class VersionOut(Answer):
    entry: str
    written_by: str
    time: str | None


class ErasedOut(Answer):
    entry: str
    store: str


class KeyStore(Answer):
    key: str
    store: str


class ForgetOut(Answer):
    ok: bool
    key: str
    bank: str
    preview: bool
    versions: list[VersionOut]
    erased: list[ErasedOut]
    erased_with: list[KeyEntry] = Field(description="rows of other keys written in the same entries, erased too")
    vectors_rewritten: list[KeyStore] = Field(description="other memories' vectors written again first")
    message: str
    warnings: list[str]
    entries: list[str] = omitted("not a preview: the signed erase entries")


# Each tool's answer, by name (an MCP tool's outputSchema; the tool command's data).
TOOL_ANSWERS: dict[str, type[Answer]] = {
    "remember": RememberOut,
    "recall": RecallOut,
    "list_memory_banks": ListBanksOut,
    "neighbors": NeighborsOut,
    "forget": ForgetOut,
}


class AutoRecallLine(Answer):
    text: str
    key: str
    bank: str | None
    db: str
    score: float
    trust: Tier


class AutoRecallAnswer(Answer):
    block: str = Field(description="the Relevant Memories block; empty when nothing bears on the messages")
    lines: list[AutoRecallLine]
    not_shown: int
    not_searched: list[str]
