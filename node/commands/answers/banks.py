"""The memory.* commands' answers: banks, grants, attachments, an agent's config, sharing,
quarantines, proposals and a bank's recall status."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from memmesh.node.commands.answers.base import Answer, omitted
from memmesh.node.commands.answers.node import RecallStatus
from memmesh.node.commands.answers.tools import RememberOut

Perm = Literal["admin", "write", "read"]


class MemoryNewAnswer(Answer):
    name: str
    id: str
    description: str


class HolderKey(Answer):
    key: str
    permission: str | None


class BankRow(Answer):
    name: str
    id: str
    description: str
    memories: int
    keys: list[HolderKey] = Field(description="the active keys of the bank's settings")


class ArchivedBank(Answer):
    name: str
    id: str


class MemoryListAnswer(Answer):
    banks: list[BankRow]
    archived: list[ArchivedBank]


class MemoryDeleteAnswer(Answer):
    name: str
    id: str
    archived: Literal[True]


class MemoryGrantAnswer(Answer):
    bank: str
    id: str
    agent: str | None = Field(description="the local agent the key is, or null")
    key: str
    label: str
    permission: Literal["read", "write"]
    changed: bool
    settings_written: bool
    reference_written: bool


class MemoryRevokeAnswer(Answer):
    bank: str
    id: str
    agent: str | None
    key: str
    label: str
    revoked: Literal[True]
    changed: bool
    settings_written: bool
    reference_written: bool
    invite_ended: bool


class Signer(Answer):
    key: str
    label: str
    entry: str | None


class Is(Answer):
    kind: str
    name: str | None
    detail: str


class InviteState(Answer):
    state: str
    perm: str
    expires: int
    redeemed_by: str | None


class Holder(Answer):
    key: str
    label: str = Field(description="what grant and revoke take for it")
    permission: str | None
    priority: int | None
    status: str
    is_: Is = Field(alias="is")
    granted_by: list[Signer]
    revoked_by: list[Signer]
    invite: InviteState = omitted()


class MemoryGrantsAnswer(Answer):
    bank: str
    id: str
    keys: list[Holder]


class MemoryAttachAnswer(Answer):
    bank: str
    id: str
    agent: str
    session: str | None
    attached: bool = Field(description="true: attached; false: detached")


class MemoryConfigAnswer(Answer):
    agent: str
    config: dict[str, Any] = Field(description="every key of the agent's memory config in force (docs/memory.md)")
    attached: dict[str, list[str]] = Field(description="session ('*': every session) -> bank names")


class Reindexed(Answer):
    bank: str
    embedded: int
    store: str


class MemoryReindexAnswer(Answer):
    reindexed: list[Reindexed]
    embedded: int


class UsageRow(Answer):
    key: str
    access_count: int
    recalls: int
    injections: int
    last_access: str | None


class MemoryStatsAnswer(Answer):
    bank: str
    id: str
    memories: int
    used: int
    most_used: list[UsageRow]
    least_used: list[UsageRow]


class MemoryShareAnswer(Answer):
    ticket: str
    bank: str
    db: str
    perm: Perm
    priority: int | None
    expires: int = Field(description="seconds since the epoch")
    recipient: str | None
    addresses: list[str]


class MemoryUnshareAnswer(Answer):
    bank: str
    was_shared: bool
    invites_ended: int


class MemoryImportAnswer(Answer):
    name: str
    db: str
    perm: Perm
    entries: int
    peer: str
    address: str


class Hidden(Answer):
    current: int
    rows: int


class Covered(Answer):
    current: int
    rows: int
    already_hidden: Hidden


class MemoryQuarantineAnswer(Answer):
    bank: str
    id: str | None = Field(description="the quarantine's entry; null in a preview")
    key: str
    name: str | None
    by: str
    by_name: str | None
    from_: str | None = Field(alias="from")
    to: str | None
    preview: bool
    hides: Covered


class MemoryReleaseAnswer(Answer):
    bank: str
    id: str
    key: str
    name: str | None
    released_by: str
    by: str
    by_name: str | None
    restores: Covered


class Released(Answer):
    entry: str
    by: str | None
    by_name: str | None
    when: str | None


class QuarantineRow(Answer):
    id: str
    key: str
    name: str | None
    by: str
    by_name: str | None
    when: str | None
    from_: str | None = Field(alias="from")
    to: str | None
    active: bool
    hides: Covered
    released: Released | None


class MemoryQuarantinesAnswer(Answer):
    bank: str
    quarantines: list[QuarantineRow]


class Proposal(Answer):
    id: str
    key: str
    value: str
    rule: str
    sentence: str
    session: str
    turn: str
    state: Literal["open", "accepted", "dropped"]
    entry: str | None


class MemoryProposalsAnswer(Answer):
    agent: str
    proposals: list[Proposal]
    count: int


class MemoryAcceptAnswer(Answer):
    agent: str
    id: str
    key: str
    value: str
    memory: RememberOut = Field(description="what remember did with it")


class MemoryDropAnswer(Answer):
    agent: str
    id: str
    key: str
    entry: str


class MemoryStatusAnswer(RecallStatus):
    bank: str
    id: str
    agent: str | None


class EntityCount(Answer):
    entity: str
    count: int


class MemoryEntitiesAnswer(Answer):
    bank: str
    id: str
    entities: list[EntityCount]
