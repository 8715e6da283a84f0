"""The published schema of every command's answer: the ``data`` of its Result.

``ANSWERS`` maps each registered command to the pydantic model of its ``data`` (what
``--json`` prints, the HTTP answer's ``data``, an MCP tool's ``structuredContent``); the
registry gives it as ``Command.answer``, the OpenAPI document publishes it under
``components/schemas`` and the MCP server as each tool's ``outputSchema``
(:func:`tool_output_schema`). :func:`check_answer` validates one answer against its model, in
its JSON form and strictly, as a client reads it; with ``MEMMESH_CHECK_ANSWERS=1`` in the
environment the registry checks every answer it returns (the test suite turns it on), so a
handler whose data drifts from its schema fails the tests that run it.

This package imports pydantic and nothing of the handlers, so the registry may look a model up
without importing them (and the handlers need not import it).
"""
from __future__ import annotations

import json
from functools import cache
from typing import Any

from pydantic import Field, TypeAdapter, ValidationError

from memmesh.node.commands.answers import banks, node, tools, work
from memmesh.node.commands.answers.base import Answer

CHECK_ENV = "MEMMESH_CHECK_ANSWERS"


class ChatSubcommand(Answer):
    name: str
    command: str
    usage: str
    help: str


class ChatHelpAnswer(Answer):
    """``/memory help``: every subcommand."""

    subcommands: list[ChatSubcommand]


class ChatTopicAnswer(ChatSubcommand):
    """``/memory help TOPIC``: one subcommand in detail."""

    from_caller: list[str] = Field(description="the fields the caller (the agent, its session) supplies")


ANSWERS: dict[str, Any] = {
    "init": node.InitAnswer,
    "status": node.StatusAnswer,
    "agent.new": node.AgentNewAnswer,
    "agent.list": node.AgentListAnswer,
    "tool": tools.RememberOut | tools.RecallOut | tools.ListBanksOut | tools.NeighborsOut | tools.ForgetOut,
    "remember": tools.RememberOut,
    "recall": tools.RecallOut,
    "autorecall": tools.AutoRecallAnswer,
    "embedder.set": node.EmbedderSetAnswer,
    "embedder.show": node.EmbedderShowAnswer,
    "memory.new": banks.MemoryNewAnswer,
    "memory.list": banks.MemoryListAnswer,
    "memory.delete": banks.MemoryDeleteAnswer,
    "memory.grant": banks.MemoryGrantAnswer,
    "memory.revoke": banks.MemoryRevokeAnswer,
    "memory.grants": banks.MemoryGrantsAnswer,
    "memory.attach": banks.MemoryAttachAnswer,
    "memory.detach": banks.MemoryAttachAnswer,
    "memory.config": banks.MemoryConfigAnswer,
    "reload": node.ReloadAnswer,
    "config.check": node.ConfigCheckAnswer,
    "config.show": node.ConfigShowAnswer,
    "memory.reindex": banks.MemoryReindexAnswer,
    "memory.stats": banks.MemoryStatsAnswer,
    "explain": node.ExplainAnswer,
    "memory.share": banks.MemoryShareAnswer,
    "memory.unshare": banks.MemoryUnshareAnswer,
    "memory.import": banks.MemoryImportAnswer,
    "peers": node.PeersAnswer,
    "refusals": node.RefusalsAnswer,
    "sync": node.SyncAnswer,
    "backup": node.BackupAnswer,
    "restore": node.RestoreAnswer,
    "check": node.CheckAnswer,
    "unfence": node.UnfenceAnswer,
    "serve": node.ServeAnswer,
    "mcp": node.McpAnswer,
    "memory.quarantine": banks.MemoryQuarantineAnswer,
    "memory.release": banks.MemoryReleaseAnswer,
    "memory.quarantines": banks.MemoryQuarantinesAnswer,
    "memory.proposals": banks.MemoryProposalsAnswer,
    "memory.accept": banks.MemoryAcceptAnswer,
    "memory.drop": banks.MemoryDropAnswer,
    "memory.status": banks.MemoryStatusAnswer,
    "forget": tools.ForgetOut,
    "memory.entities": banks.MemoryEntitiesAnswer,
    "memory.get": tools.RecalledMemory,
    "retention.set": work.RetentionSetAnswer,
    "retention.show": work.RetentionShowAnswer,
    "retention.preview": work.RetentionRunAnswer,
    "retention.run": work.RetentionRunAnswer,
    "episode.add": work.EpisodeAddAnswer,
    "episode.verdict": work.EpisodeVerdictAnswer,
    "episode.list": work.EpisodeListAnswer,
    "methods.learn": work.MethodsLearnAnswer,
    "methods.list": work.MethodsListAnswer,
    "methods.promote": work.MethodsPromoteAnswer,
    "plan-context": work.PlanContextAnswer,
    "history.add": work.HistoryAddAnswer,
    "history.show": work.HistoryShowAnswer,
    "history.compact": work.HistoryCompactAnswer,
    "history.expand": work.HistoryExpandAnswer,
    "history.window": work.HistoryWindowAnswer,
    "history.summary": work.HistorySummaryAnswer,
}
# A chat line (the ``command`` command) runs a memory.* command or forget, or answers /memory help.
_CHAT = tuple(dict.fromkeys(m for name, m in ANSWERS.items() if name.startswith("memory.") or name == "forget"))
_chat_union: Any = ChatHelpAnswer | ChatTopicAnswer
for _m in _CHAT:
    _chat_union = _chat_union | _m
ANSWERS["command"] = _chat_union

TOOL_ANSWERS: dict[str, type[Answer]] = tools.TOOL_ANSWERS


class AnswerMismatch(AssertionError):
    """A command's data that its published answer schema does not describe: a bug of the node."""


@cache
def answer_schema(name: str) -> dict[str, Any]:
    return TypeAdapter(ANSWERS[name]).json_schema()


@cache
def _adapter(model: Any) -> TypeAdapter[Any]:
    return TypeAdapter(model)


def check_answer(command: str, data: Any, model: Any = None) -> None:
    """Raise AnswerMismatch, naming the command and the fields, when ``data`` (in its JSON form,
    as a client gets it) does not match the command's answer model."""
    model = ANSWERS.get(command) if model is None else model
    if model is None:
        raise AnswerMismatch(f"{command}: no answer model (node/commands/answers ANSWERS names none)")
    try:
        _adapter(model).validate_python(json.loads(json.dumps(data)), strict=True)
    except ValidationError as exc:
        said = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'data'}: {e['msg']}" for e in exc.errors()[:5])
        raise AnswerMismatch(f"{command}: data does not match its answer schema: {said}") from None


def tool_output_schema(tool: str) -> dict[str, Any]:
    """The JSON Schema of an agent tool's result (its MCP ``outputSchema``; the structured
    content is the ``tool`` command's data for that tool). Self-contained: ``$defs`` inline."""
    return TOOL_ANSWERS[tool].model_json_schema()


__all__ = ["ANSWERS", "CHECK_ENV", "TOOL_ANSWERS", "AnswerMismatch", "answer_schema", "check_answer",
           "tool_output_schema"]
