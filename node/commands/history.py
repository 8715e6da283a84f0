"""Conversation history: history.add, show, compact, expand, window, summary.

The rows, the pyramid and the window are node/history/; here, what an agent or an operator
asks for, signed by the agent's own key in the agent's own database.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from memmesh.node.commands.params import AgentParams, Cli, Session, not_blank, worded
from memmesh.node.commands.registry import REGISTRY, command
from memmesh.node.commands.result import Result
from memmesh.node.history import service
from memmesh.node.history.labels import TextLabels, text_labels
from memmesh.node.history.record import MAX_SUMMARY_CHARS, MAX_TEXT_CHARS
from memmesh.node.history.service import TOOL_CONFIG_KEY
from memmesh.node.memory.agents import agent_state
from memmesh.node.settings import memory_defaults

if TYPE_CHECKING:
    from memmesh.node.library import Node

REGISTRY.group("history", "conversation history: add, show, compact, expand, window, summary")

# A chunk id; a turn id (ENTRY/KEY/SEQ) is of the form too, and expand says it is a turn, not a chunk.
CHUNK_PATTERN = worded("^(?:chunk:[0-9a-f]{64}|sha256:[0-9a-f]{64}/[0-9]+/[0-9]+)$",
                       "must be a chunk id (chunk: and 64 lowercase hex digits, as history show prints it)")
ChunkId = Annotated[str, Cli(positional=True, metavar="CHUNK_ID"), Field(
    pattern=CHUNK_PATTERN,
    description="a chunk id (chunk:..., as history show prints it)")]


class HistoryAdd(AgentParams):
    session: Session
    role: Annotated[Literal["user", "assistant", "tool"], Field(
        description="who said it: user (trust owner), assistant (derived), tool (ingested; recorded only when "
                    f"the agent's config {TOOL_CONFIG_KEY} is true)")]
    text: Annotated[str, Cli(positional=True), not_blank(MAX_TEXT_CHARS), Field(
        description=f"the message, verbatim (1-{MAX_TEXT_CHARS} characters)")]


class HistoryShow(AgentParams):
    session: Session
    level: Annotated[int | None, Field(ge=0, le=2, description=(
        "0: every turn; 1 or 2: every chunk of that level; default: level-2 chunks, the level-1 chunks "
        "outside them and the turns outside any chunk"))] = None


class HistoryCompact(AgentParams):
    session: Annotated[Session | None, Field(description="only this session; default: every session")] = None


class HistoryExpand(AgentParams):
    chunk: ChunkId


class HistoryWindow(AgentParams):
    session: Session
    budget: Annotated[int, Field(ge=1, le=service.MAX_BUDGET, description="the most characters the text may have")]


class HistorySummary(AgentParams):
    chunk: ChunkId
    text: Annotated[str, Cli(positional=True), not_blank(MAX_SUMMARY_CHARS), Field(
        description=f"the summary a model wrote (1-{MAX_SUMMARY_CHARS} characters), shown instead of the extractive one")]


# ---------------------------------------------------------------------------------- text
def _clip(text: str | None, width: int = 200) -> str:
    if text is None:
        return "(text not held yet)"
    one = " ".join(text.split())
    return one if len(one) <= width else one[: width - 3] + "..."


def _marks(item: dict[str, Any]) -> str:
    """``[flagged: RULE]`` and ``[secret: TYPE]``, for items kept out of what a model is shown."""
    return "".join(f"  [{k}: {item[k]}]" for k in ("flagged", "secret") if k in item)


def _item_line(item: dict[str, Any]) -> str:
    if item["kind"] == "turn":
        return f"{item['seq']:>6} {item['role']:<9} {_clip(item['text'])}{_marks(item)}\n       {item['id']}"
    tag = ("" if item["by"] == "extractive" else "  (model summary)") + _marks(item)
    return (f"  L{item['level']} turns {item['from_seq']}-{item['to_seq']}{tag}: {_clip(item['summary'], 400)}\n"
            f"       {item['id']}")


def _label_warnings(what: str, labels: TextLabels) -> list[str]:
    """What a write says when its text is withheld from models (node/history/labels.py)."""
    out = []
    if labels.secret is not None:
        out.append(f"this {what} holds a credential ({labels.secret}): stored, never put in a history window, "
                   "and recall --scope history returns it only to an agent whose config sets include_secrets")
    if labels.flag is not None:
        out.append(f"this {what} reads like an instruction to the assistant (rule {labels.flag}): stored and "
                   "flagged; never put in a history window, and recall --scope history shows it with the flag")
    return out


# ---------------------------------------------------------------------------------- commands
@command("history.add", HistoryAdd, "record a message of a conversation verbatim (and compact complete batches)")
def history_add(node: Node, p: HistoryAdd) -> Result:
    ag = node.agents.agent(p.agent)
    record_tool = bool(agent_state(ag.db, memory_defaults(node)).config.get(TOOL_CONFIG_KEY, False))
    out = service.add_turn(ag.db, ag.key, p.session, p.role, p.text, record_tool_output=record_tool)
    warnings = out.pop("warnings")
    data = {"agent": ag.name, **out}
    if not out["recorded"]:
        return Result(data, f"not recorded: {warnings[0]}", warnings)
    labels = text_labels(p.text)
    data.update(labels.fields())
    warnings = [*warnings, *_label_warnings("turn", labels)]
    chunks = f"; {len(out['chunks'])} chunk(s) written" if out["chunks"] else ""
    dedup = "" if out["text_stored"] else " (same text as an earlier turn: stored once)"
    return Result(data, f"recorded turn {out['seq']} of session {p.session} ({p.role}){dedup}{chunks}\n  id {out['id']}",
                  warnings)


@command("history.show", HistoryShow, "show a session's turns or chunks", read_only=True)
def history_show(node: Node, p: HistoryShow) -> Result:
    ag = node.agents.agent(p.agent)
    data = {"agent": ag.name, **service.show(ag.db, p.session, p.level)}
    head = (f"session {p.session}: {data['turns']} turns, {data['level1']} level-1 chunks, "
            f"{data['level2']} level-2 chunks")
    if not data["turns"]:
        head = f"no history in session {p.session} of {ag.name}"
    return Result(data, "\n".join([head, *(_item_line(i) for i in data["items"])]))


@command("history.compact", HistoryCompact, "write the chunks whose batches are complete (turns from peers too)")
def history_compact(node: Node, p: HistoryCompact) -> Result:
    ag = node.agents.agent(p.agent)
    written = service.compact(ag.db, ag.key, p.session)
    return Result({"agent": ag.name, "session": p.session, "written": written},
                  f"{len(written)} chunk(s) written" if written else "nothing to compact: every complete batch has its chunk")


@command("history.expand", HistoryExpand, "the children of a chunk: level-1 chunks or turns", read_only=True)
def history_expand(node: Node, p: HistoryExpand) -> Result:
    ag = node.agents.agent(p.agent)
    data = {"agent": ag.name, **service.expand(ag.db, p.chunk)}
    c = data["chunk"]
    lines = [f"level-{c['level']} chunk, turns {c['from_seq']}-{c['to_seq']} of session {c['session']}"
             + ("" if c["current"] else " (stale: a later turn changed its span)"),
             *(_item_line(i) for i in data["children"])]
    lines += [f"  not held yet: {m}" for m in data["missing"]]
    return Result(data, "\n".join(lines))


@command("history.window", HistoryWindow, "a session's context window: newest turns, then summaries, within a budget",
         read_only=True)
def history_window(node: Node, p: HistoryWindow) -> Result:
    ag = node.agents.agent(p.agent)
    data = {"agent": ag.name, **service.window(ag.db, p.session, p.budget)}
    left = data["withheld"]
    warnings = [f"{len(left)} item(s) of this session left out of the window: flagged or holding a credential "
                "(withheld in --json lists them)"] if left else []
    return Result(data, data["text"] or f"(nothing fits in {p.budget} characters)", warnings)


@command("history.summary", HistorySummary, "record a model's summary of a chunk, signed by the agent's key")
def history_summary(node: Node, p: HistorySummary) -> Result:
    ag = node.agents.agent(p.agent)
    data = {"agent": ag.name, **service.set_summary(ag.db, ag.key, p.chunk, p.text)}
    labels = text_labels(p.text)
    data.update(labels.fields())
    return Result(data, f"model summary of {p.chunk} recorded\n  entry {data['entry']}",
                  _label_warnings("summary", labels))
