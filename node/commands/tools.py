"""The agent tools (remember, recall, list_memory_banks, neighbors, forget) and the commands built on them.

``TOOLS`` is the tool table: per tool, the model of its arguments (what an MCP server will
publish as the tool's input schema) and the function that runs it for one agent. The ``tool``
command runs any of them by name; ``remember`` and ``recall`` are operator shortcuts whose
parameters are the tool's arguments plus the agent (and, for recall, ``--all``): the same
model, extended, so no argument is declared twice.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from memmesh.crdt.clock import now_ms
from memmesh.node.catalogue import CATALOGUE, TOOL_NAMES
from memmesh.node.commands.forgetting import forget_memory
from memmesh.node.commands.params import (
    TIME_PATTERN,
    AgentName,
    AgentParams,
    Cli,
    EntryId,
    NoParams,
    OptionalBank,
    Params,
    Session,
    Slug,
    not_blank,
    parse,
)
from memmesh.node.commands.registry import command
from memmesh.node.commands.result import Result, json_text
from memmesh.node.memory.framing import DEFAULT_CONTEXT_WINDOW, FLOOR
from memmesh.node.memory.graph import MAX_DEPTH
from memmesh.node.memory.rows import (
    MAX_EDGE_TO_CHARS,
    MAX_EDGES,
    MAX_ENTITIES,
    MAX_ENTITY_CHARS,
    MAX_KEY_CHARS,
    MAX_SCORE,
    MAX_TAG_CHARS,
    MAX_TAGS,
    MAX_VALUE_CHARS,
    MIN_SCORE,
    SOURCES,
    SUPERSEDES,
    MemoryInputError,
    check_time,
)
from memmesh.node.memory.timeline import Filters
from memmesh.node.memory.view import DEFAULT_LIMIT, MAX_LIMIT, MAX_PAGE_DEPTH
from memmesh.node.settings import check_tool

if TYPE_CHECKING:
    from memmesh.node.library import Node
    from memmesh.node.memory.agents import Agent

Tags = Annotated[list[Annotated[str, not_blank(MAX_TAG_CHARS)]], Cli(flag="--tag"), Field(
    max_length=MAX_TAGS, description=f"up to {MAX_TAGS} tags of 1-{MAX_TAG_CHARS} characters")]
Key = Annotated[str, not_blank(MAX_KEY_CHARS)]  # a memory's key (node/memory/rows.py's rule)
Entity = Annotated[str, not_blank(MAX_ENTITY_CHARS)]



Score = Annotated[int | None, Field(ge=MIN_SCORE, le=MAX_SCORE)]
WorldTime = Annotated[str | None, Field(pattern=TIME_PATTERN)]


def _not_supersedes(value: str) -> str:
    # What the schema's "not": {"const": "supersedes"} says; node/memory/rows.py's words.
    if value == SUPERSEDES:
        raise ValueError("may not be supersedes: a supersedes edge is written by the supersedes argument "
                         "(give the keys as supersedes: [KEY, ...])")
    return value


class EdgeArg(Params):
    type: Annotated[Slug, AfterValidator(_not_supersedes), Field(
        json_schema_extra={"not": {"const": SUPERSEDES}},
        description="the link's type, a lowercase slug (not supersedes: see the supersedes argument)")]
    to: Annotated[str, not_blank(MAX_EDGE_TO_CHARS), Field(description="a memory key in the same bank, or BANK:KEY")]


class RememberArgs(Params):
    key: Annotated[Key, Cli(positional=True), Field(
        description=f"the memory's key, 1-{MAX_KEY_CHARS} characters; a newer memory with the same key supersedes it")]
    value: Annotated[str, Cli(positional=True), not_blank(MAX_VALUE_CHARS), Field(
        description=f"what to remember, 1-{MAX_VALUE_CHARS} characters")]
    tags: Tags = []
    bank: OptionalBank = None
    category: Annotated[Slug | None, Field(
        description="a lowercase slug such as preference, decision, lesson, fact")] = None
    confidence: Annotated[Score, Field(description=f"how sure, {MIN_SCORE}-{MAX_SCORE}; a merge never lowers it")] = None
    importance: Annotated[Score, Field(description=f"how much it matters, {MIN_SCORE}-{MAX_SCORE}")] = None
    entities: Annotated[list[Entity], Cli(flag="--entity"), Field(
        max_length=MAX_ENTITIES, description=f"up to {MAX_ENTITIES} names of things it is about")] = []
    edges: Annotated[list[EdgeArg], Cli(flag="--edge", metavar="JSON"), Field(
        max_length=MAX_EDGES, description="typed links: [{\"type\": slug, \"to\": KEY or BANK:KEY}]")] = []
    valid_from: Annotated[WorldTime, Field(description="ISO 8601: since when the fact holds in the world")] = None
    valid_to: Annotated[WorldTime, Field(
        description="ISO 8601: until when it holds (exclusive); a past date retires the fact")] = None
    supersedes: Annotated[list[Key], Cli(flag="--supersedes"), Field(
        description="keys of other memories of the bank this one retires")] = []
    source: Annotated[Literal[SOURCES] | None, Field(  # type: ignore[valid-type]
        description="where it comes from; unrecorded reads as inferred")] = None
    on_duplicate: Annotated[Literal["merge", "supersede", "create"] | None, Field(
        description="when the bank already has this memory under another key (the same text or a near-duplicate): "
                    "merge (write into that key), supersede (save this key, retiring that one) or create (keep "
                    "both); without it nothing is saved and the answer names that memory")] = None


# A query is a question or a message, not a document: longer ones are refused before any
# tokenising (the same bound as a chat line).
MAX_QUERY_CHARS = 16_384


class RecallArgs(Params):
    model_config = ConfigDict(populate_by_name=True)

    query: Annotated[str, Cli(positional=True), Field(
        max_length=MAX_QUERY_CHARS, description="what to look for; empty: the newest memories")] = ""
    tags: Annotated[list[str], Cli(flag="--tag"), Field(
        description="only memories carrying all these tags (compared case-insensitively)")] = []
    limit: Annotated[int, Field(ge=1, le=MAX_LIMIT, description="how many memories at most")] = DEFAULT_LIMIT
    offset: Annotated[int, Field(ge=0, le=MAX_PAGE_DEPTH - MAX_LIMIT, description=(
        f"skip this many of the ranked memories first: the next page is offset + limit (offset + limit "
        f"at most {MAX_PAGE_DEPTH}); pages the memory scope"))] = 0
    bank: OptionalBank = None
    as_of: Annotated[WorldTime, Field(
        description="ISO 8601: what held in the world then, by valid_from/valid_to")] = None
    from_: Annotated[WorldTime, Cli(flag="--from"), Field(
        alias="from", description="ISO 8601: start of a period; memories valid or written in it")] = None
    to: Annotated[WorldTime, Field(description="ISO 8601: end of the period (inclusive)")] = None
    category: Annotated[Slug | None, Field(description="only memories of this category")] = None
    min_confidence: Annotated[Score, Field(description="only memories at least this confident")] = None
    entities: Annotated[list[Entity], Cli(flag="--entity"), Field(
        max_length=MAX_ENTITIES, description="only memories about all these entities (compared case-insensitively)")] = []
    as_known_at: Annotated[EntryId | None, Field(
        description="an entry id of the bank (sha256:...): recall as the store stood with that entry's "
                    "causal past, the same on every replica")] = None
    scopes: Annotated[list[Literal["memory", "history"]], Cli(flag="--scope"), Field(
        min_length=1, description="what to search: memory (the default), history (the agent's past "
                                  "conversation: turns and chunk summaries), or both")] = ["memory"]

    def filters(self, now: int) -> Filters:
        """The view's filters; ``now``: the caller's clock (it only hides facts whose end passed)."""
        when = {k: None if v is None else check_time(k, v)
                for k, v in (("as_of", self.as_of), ("from", self.from_), ("to", self.to))}
        if when["from"] is not None and when["to"] is not None and when["from"] > when["to"]:
            # Well-formed values in an order no schema can state: refused (422), not malformed (400).
            raise MemoryInputError(f"recall: from ({self.from_}) must not be after to ({self.to})")
        return Filters(self.category, self.min_confidence, when["as_of"], when["from"], when["to"], now,
                       self.as_known_at, tuple(self.entities))


def _no_supersedes(types: list[str]) -> list[str]:
    if SUPERSEDES in types:
        raise ValueError("may not include supersedes, which is not a link: recall shows supersession "
                         "(supersedes, superseded_by)")
    return types


class NeighborsArgs(Params):
    key: Annotated[Key | None, Cli(positional=True), Field(description="the memory whose links to follow")] = None
    entity: Annotated[Entity | None, Field(description="start from the memories about this entity instead of one "
                                                  "key (memory entities lists them)")] = None
    bank: OptionalBank = None
    types: Annotated[list[Slug], AfterValidator(_no_supersedes),
                     Cli(flag="--type"), Field(max_length=MAX_EDGES, description=(
                         "only links of these types (lowercase slugs); default: every type"))] = []
    depth: Annotated[int, Field(ge=1, le=MAX_DEPTH, description=(
        f"how many links away, 1-{MAX_DEPTH}; each memory at its shortest distance"))] = 1

    schema_rules: ClassVar[dict[str, Any]] = {"oneOf": [
        {"required": [start], "properties": {start: {"type": "string"}}} for start in ("key", "entity")]}

    @model_validator(mode="after")
    def _one_start(self) -> NeighborsArgs:
        if (self.key is None) == (self.entity is None):
            raise ValueError("give a memory key or an entity to start from (one of the two)")
        return self


class ForgetArgs(Params):
    key: Annotated[Key, Cli(positional=True), Field(
        description="the memory key to forget: every version of it (current and superseded) is erased")]
    bank: OptionalBank = None
    preview: Annotated[bool, Field(
        description="say what would be erased (and what with it), erase nothing")] = False


@dataclass(frozen=True)
class Tool:
    args: type[Params]
    run: Callable[[Node, Agent, Any], dict[str, Any]]
    description: str


# Each tool checks the agent's allowed_tools (config.yaml) first: every way of running a tool
# comes through these functions, so none can skip it.
def _remember(node: Node, agent: Agent, a: RememberArgs) -> dict[str, Any]:
    check_tool(node, agent.name, "remember")
    return node.memory.remember(
        agent, a.key, a.value, a.tags, a.bank, supersedes=a.supersedes, category=a.category,
        confidence=a.confidence, importance=a.importance, entities=a.entities or None,
        edges=[e.model_dump() for e in a.edges] or None, valid_from=a.valid_from, valid_to=a.valid_to,
        source=a.source, on_duplicate=a.on_duplicate)


def _recall(node: Node, agent: Agent, a: RecallArgs, include_superseded: bool = False,
            count: bool = True) -> dict[str, Any]:
    check_tool(node, agent.name, "recall")
    out = {"memories": [], "count": 0, "bank": a.bank or agent.name, "message": "", "warnings": []}
    if "memory" in a.scopes:
        out = node.memory.recall(agent, a.query, a.tags, a.limit, a.bank, include_superseded=include_superseded,
                                 count=count, filters=a.filters(now_ms()), offset=a.offset)
    if "history" in a.scopes:
        from memmesh.node.history.search import search_history  # history is the agent's own conversation
        from memmesh.node.memory.agents import agent_state

        # The config in force (config.yaml's defaults under the agent's own): the same secrets
        # and flagged-weight rules as the memory scope.
        cfg = agent_state(agent.db, node.memory.settings.defaults()).config
        found = search_history(agent.db, a.query, a.limit, include_secrets=bool(cfg["include_secrets"]),
                               flagged_weight=float(cfg["trust_weights"]["flagged"]))
        out["history"] = found
        n = len(found)
        said = f"{n} past discussion hit{'' if n == 1 else 's'} (history: drill down with history expand)"
        out["message"] = f"{out['message']} {said}".strip() if out["message"] else said
    return out


def _list_banks(node: Node, agent: Agent, a: NoParams) -> dict[str, Any]:
    check_tool(node, agent.name, "list_memory_banks")
    return node.memory.list_banks(agent)


def _neighbors(node: Node, agent: Agent, a: NeighborsArgs) -> dict[str, Any]:
    check_tool(node, agent.name, "neighbors")
    return node.memory.neighbors(agent, a.key, a.bank, a.types, a.depth, entity=a.entity)


def _forget(node: Node, agent: Agent, a: ForgetArgs) -> dict[str, Any]:
    check_tool(node, agent.name, "forget")
    return forget_memory(node, agent, a.key, a.bank, preview=a.preview)


# What runs each tool of the catalogue (node/catalogue.py: names, descriptions, hints).
_RUNS: dict[str, tuple[type[Params], Callable[[Node, Agent, Any], dict[str, Any]]]] = {
    "remember": (RememberArgs, _remember),
    "recall": (RecallArgs, _recall),
    "list_memory_banks": (NoParams, _list_banks),
    "neighbors": (NeighborsArgs, _neighbors),
    "forget": (ForgetArgs, _forget),
}
if set(_RUNS) != set(TOOL_NAMES):
    raise RuntimeError(f"the tools run here {sorted(_RUNS)} are not the catalogue's {sorted(TOOL_NAMES)}")
TOOLS: dict[str, Tool] = {t.name: Tool(*_RUNS[t.name], t.description) for t in CATALOGUE}


class ToolCall(Params):
    agent: AgentName
    tool: Annotated[Literal[tuple(TOOLS)], Cli(positional=True), Field(description="the tool to run")]  # type: ignore[valid-type]
    args: Annotated[dict[str, Any], Cli(positional=True), Field(
        description="the tool's arguments as a JSON object")] = {}


def _tool_result(data: dict[str, Any]) -> Result:
    return Result(data, json_text(data), list(data.get("warnings", [])))


# One route per tool: POST /v1/agents/{agent}/tools/<tool>, the body the tool's arguments (node/api/routes.py).
@command("tool", ToolCall, f"run an agent tool: {', '.join(TOOL_NAMES[:-1])} or {TOOL_NAMES[-1]}",
         http=("POST", "/v1/agents/{agent}/tools/{tool}"))
def tool(node: Node, p: ToolCall) -> Result:
    spec = TOOLS[p.tool]
    args = parse(spec.args, p.args, p.tool)
    return _tool_result(spec.run(node, node.agents.agent(p.agent), args))


class Remember(RememberArgs, AgentParams):
    pass


# Operator shortcuts: not routed, the tool routes are the API's one way to remember and recall.
@command("remember", Remember, "store a memory (shortcut for the remember tool)", http=None)
def remember(node: Node, p: Remember) -> Result:
    return _tool_result(_remember(node, node.agents.agent(p.agent), p))


class Recall(RecallArgs, AgentParams):
    include_superseded: Annotated[bool, Cli(flag="--all"), Field(
        description="also list rows superseded by a newer row for the same key")] = False
    # Scripts that inspect memories should not make them look used; the agent tool always counts.
    no_count: Annotated[bool, Cli(flag="--no-count"), Field(
        description="do not count this recall in the memories' access counts")] = False


@command("recall", Recall, "search memories (shortcut for the recall tool)", http=None)
def recall(node: Node, p: Recall) -> Result:
    data = _recall(node, node.agents.agent(p.agent), p, include_superseded=p.include_superseded,
                   count=not p.no_count)
    return Result(data, render_memories(data), list(data.get("warnings", [])))


def render_memories(data: dict[str, Any]) -> str:
    if not data["memories"] and not data.get("history"):
        return data["message"]
    lines = []
    for m in data["memories"]:
        tags = f" [{', '.join(m['tags'])}]" if m["tags"] else ""
        lines.append(f"{m['key']}: {m['value']}{tags}  ({m['time']}, {m['bank']})")
    for h in data.get("history", []):
        text = h.get("text") or h.get("summary") or ""
        where = f"turn {h['seq']}" if h["kind"] == "turn" else f"chunk L{h['level']} {h['from_seq']}-{h['to_seq']}"
        lines.append(f"past discussion ({h['session']}, {where}, {h['id']}): {text}")
    return "\n".join(lines)


class AutoRecall(AgentParams):
    messages: Annotated[list[str], Cli(positional=True, metavar="MESSAGE"), Field(
        description="the conversation so far, oldest first (the last 5 are used)")]
    session: Annotated[Session | None, Field(description="the session, for banks attached to one session")] = None
    # A preview (the cockpit's page) shows the block without injecting it into any model's context.
    no_count: Annotated[bool, Cli(flag="--no-count"), Field(
        description="a preview: do not count the lines shown as injections in the access counts")] = False
    context_window: Annotated[int, Field(
        ge=0, le=100_000_000,
        description="the answering model's context window in tokens; sizes the block "
                    f"(2,400 characters at 100,000; nothing below {FLOOR:,})")] = DEFAULT_CONTEXT_WINDOW
    now: Annotated[WorldTime, Field(
        description="the caller's clock (ISO 8601), for age decay and facts whose valid_to has passed; "
                    "default: this node's clock")] = None


@command("autorecall", AutoRecall, "print the Relevant Memories block for the last messages",
         http=("POST", "/v1/agents/{agent}/autorecall"))
def autorecall(node: Node, p: AutoRecall) -> Result:
    text, lines, left_out, missing = node.memory.auto_recall_result(
        node.agents.agent(p.agent), p.messages, p.session, count=not p.no_count, context_window=p.context_window,
        now=None if p.now is None else check_time("now", p.now))
    return Result({"block": text, "lines": lines, "not_shown": left_out, "not_searched": missing},
                  text.rstrip("\n"))
