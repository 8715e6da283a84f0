"""The node's own commands: init, status, agents, the embedder, config, explain, peers,
refusals, sync, backup, restore, check, unfence, and the transports (serve, mcp)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from memmesh.node.commands.answers.base import Answer, OpenAnswer, omitted


class InitAnswer(Answer):
    home: str
    peer_key: str
    created: bool = Field(description="false: the node existed already")
    config_written: bool = Field(description="a commented config.yaml template was written")
    made_private: list[str] = Field(description="files and directories whose mode was tightened")


# ---------------------------------------------------------------------------------- status
class Listeners(Answer):
    sync: str | None
    api: str | None
    address: str | None


class Verify(Answer):
    entries: int
    per_s: float | None


class Counts(Answer):
    banks: int
    databases: int
    peers: int
    errors: int


class MemoryViews(Answer):
    views_open: int = Field(description="banks whose recall index is built in memory now")
    view_bytes: int = Field(description="their estimated bytes (arrays and Python objects)")
    budget_bytes: int = Field(description="memory.view_budget_mib in bytes: past it the least recently used "
                                          "idle indexes are closed")
    closed: int = Field(description="indexes closed under the budget since the node opened")


class NodeView(Answer):
    key: str
    serving: bool
    listeners: Listeners
    discovery: bool | None
    uptime_s: float | None
    verify: Verify
    counts: Counts
    memory: MemoryViews


class GrantRow(Answer):
    key: str
    name: str | None
    level: str | None
    priority: int | None
    status: str
    granted_by: str | None
    entry: str | None


class Quarantines(Answer):
    active: int
    released: int


class RecallStatus(Answer):
    embedder: str | None
    memories: int
    with_vectors: int
    embeddable: int
    share: float | None
    tiers: dict[str, int]
    flagged_by_rule: dict[str, int]
    secrets: int
    quarantines: Quarantines


class LinkView(Answer):
    peer: str
    not_sent: str | None = Field(description="why nothing of the bank goes to that peer now, or null")
    peer_lacks: int
    we_lack: int
    last_exchange_ms: int | None
    last_attempt_ms: int | None
    feeds_seen_ms: int | None
    last_error: str | None
    backoff_ms: int
    bytes_in: int
    bytes_out: int
    refused: dict[str, int]


class BankSync(Answer):
    worst_lag: int
    last_complete_exchange_age_s: float | None
    stale: bool
    stale_since_ms: int | None
    peers: list[LinkView]


class DatabaseStatus(Answer):
    id: str
    kind: str | None
    name: str | None
    bank: str
    entries: int
    heads: list[str]
    shared: bool
    pending: int
    refused: dict[str, dict[str, int]] = Field(description="source -> reason -> entries refused")
    authors: int
    payload_pending: int
    refused_by_reason: dict[str, int]
    grants: list[GrantRow]
    recall: RecallStatus | None = Field(description="null while the bank's recall index is not open: status never "
                                                    "builds one (memmesh memory status BANK does)")
    sync: BankSync


class FenceRow(Answer):
    db: str
    name: str
    reason: str
    since_ms: int
    why: str


class SyncLinkRow(Answer):
    db: str
    bank: str
    peer: str
    last_success_ms: int | None
    last_error: str | None
    behind: int
    peer_behind: int
    pulled: int
    pushed: int
    refused: dict[str, int]
    backoff_ms: int


class SyncSummary(Answer):
    serving: bool
    address: str | None
    links: list[SyncLinkRow]


class StatusAnswer(Answer):
    home: str
    peer_key: str
    node: NodeView
    databases: list[DatabaseStatus]
    fenced: list[FenceRow]
    sync: SyncSummary


# ---------------------------------------------------------------------------------- agents
class AgentNewAnswer(Answer):
    name: str
    id: str
    key: str


class AgentRow(Answer):
    name: str
    id: str
    key: str
    attached: dict[str, list[str]] = Field(description="session ('*': every session) -> bank names")
    default_banks: list[str]
    config: dict[str, Any] = Field(description="the agent's memory config in force (docs/memory.md)")


class AgentListAnswer(Answer):
    agents: list[AgentRow]


# ---------------------------------------------------------------------------------- embedder
class EmbedderSetAnswer(Answer):
    provider: str
    model: str = omitted("absent when the provider is none")
    dim: int = omitted()
    store: str = omitted()


class EmbedderShowAnswer(Answer):
    provider: str
    model: str | None
    api_base: str | None
    dim: int | None
    store: str | None
    api_key_set: bool


# ---------------------------------------------------------------------------------- config
class ReloadAnswer(Answer):
    file: str
    changes: list[str]


class ConfigCheckAnswer(Answer):
    file: str
    ok: Literal[True]
    agents: list[str]


class ConfigShowAnswer(OpenAnswer):
    """The config in force, section by section as config.yaml spells it (docs/operations.md,
    "Configuration"), plus where each setting came from."""

    sources: dict[str, str] = Field(description="SECTION.KEY -> default, config.yaml, command line (...) "
                                                "or environment (...)")
    serving: bool


# ---------------------------------------------------------------------------------- explain, peers, refusals, sync
class ExplainAnswer(Answer):
    entry: str
    database: str
    name: str
    explanation: str


class PeerBank(Answer):
    db: str
    bank: str
    how: str
    addresses: list[str]
    last_success_ms: int | None
    last_error: str | None
    failures: int
    next_try_ms: int


class PeerRow(Answer):
    key: str
    addresses: list[str]
    how: str
    connected: bool
    last_seen_ms: int | None
    bytes_in: int
    bytes_out: int
    banks: list[str]
    refused: dict[str, int]
    db: str | None
    bank: str | None
    ways: list[str]
    last_success_ms: int | None
    last_error: str | None
    failures: int
    next_try_ms: int
    per_bank: list[PeerBank]


class PeersAnswer(Answer):
    peers: list[PeerRow]
    lan: list[dict[str, Any]] = Field(description="peers discovered on the LAN (key, addresses, ...)")


class RefusalRow(Answer):
    cursor: int
    entry: str
    author: str | None
    db: str
    bank: str
    source: str
    reason: str
    first_seen_ms: int
    explain: str


class RefusalsAnswer(Answer):
    refusals: list[RefusalRow]
    next: int | None = Field(description="the cursor of the next page (before=), or null")


class Exchange(Answer):
    db: str = Field(description="the database, or - when the peer did not answer its hello")
    peer: str = Field(description="the peer's key, or ? when it did not answer its hello")
    address: str
    ok: bool
    error: str | None
    pulled: int
    pushed: int
    cut: bool = omitted("the exchange's deadline stopped it before it pulled or pushed all")
    withheld: str | None = omitted("why a blind exchange sent the peer nothing of ours")


class SyncAnswer(Answer):
    exchanges: list[Exchange]


# ---------------------------------------------------------------------------------- backup, restore, check, unfence
class BackupAnswer(Answer):
    dest: str
    databases: int
    keys: int
    bytes: int
    files: list[str]


class RestoreAnswer(Answer):
    home: str
    src: str
    databases: int
    keys: int
    bytes: int
    files: list[str]
    fenced: list[str]
    moved_aside: str | None


class Problem(Answer):
    code: str
    detail: str
    entry: str | None
    store: str | None
    author: str | None
    seq: int | None
    damage: bool
    repairable: bool


class StorageReport(Answer):
    file: str
    schema_version: int | None
    healthy: bool
    problems: list[Problem]
    salvaged: dict[str, Any] | None


class KeysReport(Answer):
    checked: int
    problems: list[Problem]


class Lost(Answer):
    entry: str
    why: str
    store: str | None
    author: str | None
    seq: int | None


class DatabaseRepair(Answer):
    moved_aside: list[str]
    payloads_cleared: list[list[str]]
    erased: int
    exchanges: list[dict[str, Any]]
    reapplied: list[str]
    recovered: list[str]
    payloads_recovered: list[list[str]]
    lost: list[Lost]
    error: str | None
    fenced: bool


class ViewSnapshot(Answer):
    file: str
    store: str | None
    dim: int | None
    docs: int | None
    verdict: str


class DatabaseReport(Answer):
    db: str
    name: str
    kind: str
    entries: int
    pending: int
    signatures: int
    healthy: bool
    problems: list[Problem]
    missing_payloads: list[list[str]]
    waiting_for: list[str]
    aside: list[dict[str, Any]]
    repair: DatabaseRepair | None
    views: list[ViewSnapshot]


class CheckAnswer(Answer):
    home: str
    repair: bool
    healthy: bool
    found_damage: bool
    remaining: list[str] | None
    storage: StorageReport
    keys: KeysReport
    local: list[Problem]
    databases: list[DatabaseReport]
    stray_views: list[ViewSnapshot]
    seconds: float
    entries: int
    signatures: int


class FenceOut(Answer):
    db: str
    reason: str
    since_ms: int
    keys: list[str]
    catch_up: bool
    lost: dict[str, int]


class UnfenceAnswer(Answer):
    db: str
    name: str
    was_fenced: bool
    fence: FenceOut | None


# ---------------------------------------------------------------------------------- transports
class ServeAnswer(Answer):
    pid: int
    listen: str | None
    signal: str | None


class McpAnswer(Answer):
    agent: str
