"""The answers of what an agent's work leaves: episodes and methods, history, retention."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from memmesh.node.commands.answers.base import Answer, omitted


# ---------------------------------------------------------------------------------- episodes
class StepOut(Answer):
    tool: str
    status: str
    note: str = omitted()


class VerdictOut(Answer):
    id: str
    episode: str
    verdict: Literal["yes", "no", "unsure"]
    reason: str | None
    by: str
    ts: int
    by_name: str | None
    time: str | None


class EpisodeOut(Answer):
    id: str
    kind: str
    outcome: str
    checked_by: str
    checked: bool
    summary: str | None
    by: str
    ts: int
    steps: list[StepOut]
    by_name: str | None
    time: str | None
    sequence: list[str]
    flagged: str | None
    left_out: str | None = Field(description="why it never counts for learning or planning, or null")
    verdicts: list[VerdictOut]


class EpisodeAddAnswer(Answer):
    agent: str
    id: str
    kind: str
    outcome: str
    checked_by: str
    checked: bool
    sequence: list[str]
    flagged: str | None
    by: str


class EpisodeVerdictAnswer(Answer):
    agent: str
    id: str
    episode: str
    verdict: Literal["yes", "no", "unsure"]
    reason: str | None
    by: str
    by_name: str | None
    outcome: str
    checked_by: str
    verdicts: int = Field(description="how many verdicts the episode has now")


class EpisodeListAnswer(Answer):
    agent: str
    episodes: list[EpisodeOut]


class Promotion(Answer):
    entry: str
    by: str
    ts: int
    by_name: str | None = omitted()
    time: str | None = omitted()


class MethodOut(Answer):
    id: str
    kind: str
    sequence: list[str]
    checked: int
    successes: int
    with_sequence: int
    confidence: float
    evidence: list[str]
    promoted: bool
    promotion: Promotion | None


class KindReport(Answer):
    kind: str
    episodes: int
    checked: int
    successes: int
    left_out: dict[str, int]
    top_sequence: list[str] | None
    top_count: int
    status: str
    why: str


class MethodsLearnAnswer(Answer):
    agent: str
    kinds: list[KindReport]
    candidates: list[MethodOut]
    promoted: list[MethodOut]


class MethodsListAnswer(Answer):
    agent: str
    methods: list[MethodOut]


class MethodsPromoteAnswer(Answer):
    agent: str
    entry: str
    method: MethodOut


class PlanContextAnswer(Answer):
    agent: str
    block: str
    episodes: list[str]
    methods: list[str]
    not_shown: int


# ---------------------------------------------------------------------------------- history
class Captured(Answer):
    class Item(Answer):
        id: str
        key: str
        value: str
        rule: str

    mode: str
    proposed: list[Item]
    saved: list[Item]
    entry: str = omitted()
    warnings: list[str] = omitted()


class HistoryAddAnswer(Answer):
    agent: str
    recorded: bool = Field(description="false: a tool turn the agent's config does not record")
    session: str
    role: str
    id: str | None
    seq: int | None
    chunks: list[str]
    trust: str = omitted()
    entry: str = omitted()
    text_stored: bool = omitted()
    captured: Captured = omitted()
    flagged: str = omitted()
    secret: str = omitted()


class TurnOut(Answer):
    kind: Literal["turn"]
    id: str
    session: str
    seq: int
    level: Literal[0]
    role: str
    trust: str
    time: str | None
    written_by: str
    text: str | None
    flagged: str = omitted()
    secret: str = omitted()


class ModelSummary(Answer):
    summary: str | None
    written_by: str


class ChunkOut(Answer):
    kind: Literal["chunk"]
    id: str
    session: str
    level: int
    from_seq: int
    to_seq: int
    children: list[str]
    summary: str | None
    by: str
    extractive: str | None
    model: ModelSummary | None
    stored: bool
    current: bool
    time: str | None
    flagged: str = omitted()
    secret: str = omitted()


HistoryItem = Annotated[TurnOut | ChunkOut, Field(discriminator="kind")]


class HistoryShowAnswer(Answer):
    agent: str
    session: str
    level: int | None
    turns: int
    level1: int
    level2: int
    items: list[HistoryItem]


class HistoryCompactAnswer(Answer):
    agent: str
    session: str | None
    written: list[str]


class HistoryExpandAnswer(Answer):
    agent: str
    chunk: ChunkOut
    children: list[HistoryItem]
    missing: list[str]


class WindowItem(Answer):
    kind: Literal["turn", "chunk"]
    id: str
    level: int
    from_seq: int
    to_seq: int


class Withheld(WindowItem):
    reason: str


class HistoryWindowAnswer(Answer):
    agent: str
    session: str
    budget: int
    chars: int
    text: str
    items: list[WindowItem]
    turns: int
    raw_turns: int
    withheld: list[Withheld]


class HistorySummaryAnswer(Answer):
    agent: str
    id: str
    session: str
    level: int
    by: Literal["model"]
    written_by: str
    entry: str
    flagged: str = omitted()
    secret: str = omitted()


# ---------------------------------------------------------------------------------- retention
class PolicyValue(Answer):
    op: Literal["policy"]
    days: int
    compress_after: int | None
    success_x: float
    failure_x: float
    keep_promoted_evidence: bool
    erase_retired_memories: Literal[True] = omitted("present only when the option is on")


class PolicyInForce(PolicyValue):
    entry: str | None
    by: str | None


class RetentionSetAnswer(Answer):
    db: str
    id: str
    policy: PolicyValue
    entry: str


class RetentionShowAnswer(Answer):
    db: str
    id: str
    policy: PolicyInForce | None


class EraseOut(Answer):
    entry: str
    store: str
    reason: str


class RetentionRunAnswer(Answer):
    db: str
    id: str
    now: int
    compressed: int
    episodes: int
    memories: int
    vectors: int
    erase: list[EraseOut]
    entries: list[str] = omitted("a run, not a preview: the signed erase entries")
