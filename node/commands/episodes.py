"""Task episodes, learned methods, the planner's block: episode.add/verdict/list,
methods.learn/list/promote, plan-context.

The rows and the rules are node/episodes/; here, what a caller asks for, refused before anything
is written (bad input, a signer that may not write, a promotion by a key that is not admin).
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field

from memmesh.auth.errors import AuthError, MemmeshError
from memmesh.auth.keys import SigningKey
from memmesh.auth.permissions import ADMIN, holds
from memmesh.node.commands.params import AgentParams, Cli, EntryId, OptionalAgent, Params, Slug, not_blank
from memmesh.node.commands.registry import REGISTRY, command
from memmesh.node.commands.result import Result
from memmesh.node.episodes.methods import METHODS_STORE, Learned, Method, learn, promote_value, promoted
from memmesh.node.episodes.plan import DEFAULT_EPISODES, MAX_CHARS, MAX_EPISODES, plan_context
from memmesh.node.episodes.record import (
    MAX_NOTE_CHARS,
    MAX_REASON_CHARS,
    MAX_STEPS,
    MAX_SUMMARY_CHARS,
    MAX_TOOL_CHARS,
    Episode,
    episode_value,
    episodes,
    exclusion,
    verdict_value,
    verdicts,
    write_episode,
    write_verdict,
)
from memmesh.node.memory.quarantine import quarantines
from memmesh.node.memory.rows import iso_utc
from memmesh.node.registry import UnknownName

if TYPE_CHECKING:
    from memmesh.node.library import Node
    from memmesh.node.memory.agents import Agent

REGISTRY.group("episode", "task episodes: add (what ran, how it ended, what decided it), verdict, list")
REGISTRY.group("methods", "methods learned from checked episodes: learn, list, promote")


class UnknownEpisode(UnknownName):
    """An episode id that names no episode of the agent's database."""


class UnknownMethod(UnknownName):
    """A method id that is neither a current candidate nor a promoted method."""


class AlreadyPromoted(MemmeshError):
    """A promotion of a method that is already promoted."""


def _steps(value: Any) -> Any:
    """``--steps '[...]'`` on the command line arrives as a list holding that list (each use of the
    option is one JSON value); JSON text from elsewhere is read too."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError('steps is a JSON list of steps, [{"tool": "build", "status": "ok"}, ...]') from None
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        value = [s for part in value for s in part]
    return value


Kind = Slug
Signer = Annotated[OptionalAgent, Cli(flag="--as", metavar="AGENT"), Field(
    alias="as", description="sign with this agent's key (it must hold write on AGENT's database); "
                            "default: AGENT's own key")]


class StepArg(Params):
    tool: Annotated[str, not_blank(MAX_TOOL_CHARS), Field(description="the tool that ran")]
    status: Annotated[Literal["ok", "error", "skipped"], Field(description="how the step ended")]
    note: Annotated[str | None, not_blank(MAX_NOTE_CHARS), Field(
                                      description="what happened, in a few words")] = None


class EpisodeAdd(AgentParams):
    model_config = ConfigDict(populate_by_name=True)

    kind: Annotated[Kind, Field(description="the kind of task, a lowercase slug (deploy-service)")]
    steps: Annotated[list[StepArg], BeforeValidator(_steps), Field(
        min_length=1, max_length=MAX_STEPS,
        description=f'the tools that ran, in order: a JSON list of 1-{MAX_STEPS} '
                    '{"tool": ..., "status": "ok"|"error"|"skipped", "note"?: ...}')]
    outcome: Annotated[Literal["success", "failure", "unknown"], Field(description="how the task ended")]
    checked_by: Annotated[Literal["tool", "test", "check", "person", "none"], Field(
        description="what decided the outcome; only tool, test, check and person make the episode checked "
                    "(none: the model's own word, which learning ignores)")]
    summary: Annotated[str | None, not_blank(MAX_SUMMARY_CHARS), Field(
                                         description="the task in a sentence or two")] = None
    as_: Signer = None


class EpisodeVerdict(AgentParams):
    model_config = ConfigDict(populate_by_name=True)

    episode: Annotated[EntryId, Cli(positional=True, metavar="EPISODE"), Field(
        description="the episode's id (sha256:..., as episode list shows it)")]
    verdict: Annotated[Literal["yes", "no", "unsure"], Cli(positional=True), Field(
        description="did it work: kept beside the tools' result, never replacing it")]
    reason: Annotated[str | None, not_blank(MAX_REASON_CHARS), Field(description="why")] = None
    as_: Signer = None


class EpisodeList(AgentParams):
    kind: Annotated[Kind | None, Field(description="only episodes of this kind")] = None
    limit: Annotated[int, Field(ge=1, le=10_000, description="the newest this many")] = 100


class MethodsLearn(AgentParams):
    pass


class MethodsPromote(AgentParams):
    model_config = ConfigDict(populate_by_name=True)

    method: Annotated[str, Cli(positional=True, metavar="ID"), Field(
        min_length=1, max_length=80, description="the method's id (method:..., as methods list shows it)")]
    as_: Annotated[OptionalAgent, Cli(flag="--as", metavar="AGENT"), Field(
        alias="as", description="sign with this agent's key (it must hold admin on AGENT's database); "
                                "default: AGENT's own key")] = None


class PlanContext(AgentParams):
    task: Annotated[str, Cli(positional=True, metavar="TASK"), Field(
        min_length=1, max_length=10_000, description="the task the planner is about to plan")]
    limit: Annotated[int, Field(ge=1, le=MAX_EPISODES, description="at most this many past episodes")] = DEFAULT_EPISODES


# ---------------------------------------------------------------------------------- helpers
def _names(node: Node) -> dict[str, str]:
    """Public key -> the agent name this node knows it by."""
    return {str(node.load_key(r.key_name).public): r.name for r in node.agents.agents()}


def _who(key: str, names: dict[str, str]) -> str:
    return f"{names[key]} ({key})" if key in names else key


def _signer(node: Node, agent: Agent, other: str | None, needed: str) -> SigningKey:
    """The key that signs: the agent's own, or ``--as``'s; refused unless it holds ``needed`` on the
    agent's database now (the database would refuse it anyway, in less helpful words)."""
    key = agent.key if other is None else node.agents.agent(other).key
    held = agent.db.permission(str(key.public))
    if not holds(held, needed):
        who = agent.name if other is None else other
        hint = (f"grant it with: memmesh memory grant {agent.name} {who} write" if needed == "write"
                else f"only an admin of {agent.name}'s database may (its own key is one): leave --as out, or sign "
                     "with an admin's key")
        raise AuthError(f"auth.not_{'admin' if needed == ADMIN else 'writer'}",
                        f"{who}'s key holds {'no permission' if held is None else held} on {agent.name}'s database "
                        f"and this needs {needed}; {hint}")
    return key


def _episode_dict(ep: Episode, qs: list, given: dict[str, list], names: dict[str, str]) -> dict[str, Any]:
    return {**ep.to_dict(), "by_name": names.get(ep.author), "time": iso_utc(ep.ts),
            "sequence": list(ep.sequence), "flagged": ep.flag(), "left_out": exclusion(ep, qs),
            "verdicts": [{**v.to_dict(), "by_name": names.get(v.author), "time": iso_utc(v.ts)}
                         for v in given.get(ep.id, [])]}


def _method_dict(m: Method, names: dict[str, str]) -> dict[str, Any]:
    d = m.to_dict()
    if m.promotion is not None:
        d["promotion"] = {**d["promotion"], "by_name": names.get(m.promotion.by), "time": iso_utc(m.promotion.ts)}
    return d


def _method_text(m: Method, names: dict[str, str]) -> str:
    state = (f"promoted by {_who(m.promotion.by, names)} at {iso_utc(m.promotion.ts)}" if m.promotion
             else "candidate")
    return (f"{m.id}  {m.kind}: {' -> '.join(m.sequence)}  ({state})\n  rests on "
            f"{_n(m.checked, 'checked episode', 'checked episodes')}, {_n(m.successes, 'success', 'successes')}, "
            f"{m.with_sequence} with this sequence; confidence {m.confidence:.2f}")


def _n(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


# ---------------------------------------------------------------------------------- commands
@command("episode.add", EpisodeAdd, "record a task episode: the tools that ran in order, how each step ended, "
         "the outcome and what decided it")
def episode_add(node: Node, p: EpisodeAdd) -> Result:
    agent = node.agents.agent(p.agent)
    value = episode_value(p.kind, [s.model_dump(exclude_none=True) for s in p.steps], p.outcome, p.checked_by,
                          p.summary)
    key = _signer(node, agent, p.as_, "write")
    entry = write_episode(agent.db, key, value)
    ep = next(e for e in episodes(agent.db) if e.id == entry)
    warnings = []
    flag = ep.flag()
    if flag is not None:
        warnings.append(f"this episode reads like an instruction to the assistant (rule {flag}): stored and flagged; "
                        "it never counts for learning and is never shown to a planner")
    checked = ep.checked
    data = {"agent": agent.name, "id": entry, "kind": ep.kind, "outcome": ep.outcome, "checked_by": ep.checked_by,
            "checked": checked, "sequence": list(ep.sequence), "flagged": flag, "by": ep.author}
    note = "" if checked else " (not checked: learning ignores it; --checked-by tool|test|check|person makes it count)"
    return Result(data, f"episode {entry}\n  {ep.kind}: {' -> '.join(ep.sequence)}, {ep.outcome}{note}", warnings)


@command("episode.verdict", EpisodeVerdict, "give a verdict on an episode (yes, no, unsure): kept beside the tools' "
         "result, signed by whoever gives it")
def episode_verdict(node: Node, p: EpisodeVerdict) -> Result:
    agent = node.agents.agent(p.agent)
    value = verdict_value(p.episode, p.verdict, p.reason)
    ep = next((e for e in episodes(agent.db) if e.id == p.episode), None)
    if ep is None:
        raise UnknownEpisode(f"no episode {p.episode} in {agent.name}'s database (memmesh episode list {agent.name} "
                             "lists them)")
    key = _signer(node, agent, p.as_, "write")
    entry = write_verdict(agent.db, key, value)
    names = _names(node)
    by = str(key.public)
    all_given = verdicts(agent.db).get(ep.id, [])
    return Result({"agent": agent.name, "id": entry, "episode": ep.id, "verdict": p.verdict, "reason": p.reason,
                   "by": by, "by_name": names.get(by), "outcome": ep.outcome, "checked_by": ep.checked_by,
                   "verdicts": len(all_given)},
                  f"verdict {p.verdict} on episode {ep.id} by {_who(by, names)}\n  the episode's own result stays: "
                  f"{ep.outcome}, checked by {ep.checked_by}; {len(all_given)} verdict(s) on it")


@command("episode.list", EpisodeList, "list an agent's task episodes with their verdicts and who gave them",
         read_only=True)
def episode_list(node: Node, p: EpisodeList) -> Result:
    agent = node.agents.agent(p.agent)
    eps = [e for e in episodes(agent.db) if p.kind is None or e.kind == p.kind][-p.limit:]
    qs = quarantines(agent.db)
    given = verdicts(agent.db)
    names = _names(node)
    rows = [_episode_dict(e, qs, given, names) for e in eps]
    lines = []
    for d in rows:
        mark = (f"; {d['left_out']}" if d["left_out"] else "")
        steps = " -> ".join(f"{s['tool']} {s['status']}" for s in d["steps"])
        lines.append(f"{d['id']}  {d['time']}\n  {d['kind']}: {steps}"
                     f"\n  {d['outcome']}, {'checked by ' + d['checked_by'] if d['checked'] else 'not checked'}{mark}"
                     + (f"\n  {d['summary']}" if d["summary"] else "")
                     + "".join(f"\n  verdict {v['verdict']} by {_who(v['by'], names)}"
                               + (f": {v['reason']}" if v["reason"] else "") for v in d["verdicts"]))
    return Result({"agent": agent.name, "episodes": rows}, "\n".join(lines) or f"no episodes in {agent.name}'s database")


def _learned(agent: Agent) -> Learned:
    return learn(agent.db)


@command("methods.learn", MethodsLearn, "group an agent's checked episodes by kind and show the candidate methods "
         "(computed from the rows, the same on every replica; nothing is written)", read_only=True)
def methods_learn(node: Node, p: MethodsLearn) -> Result:
    agent = node.agents.agent(p.agent)
    learned = _learned(agent)
    names = _names(node)
    lines = []
    for k in learned.kinds:
        out = ", ".join(f"{n} {why}" for why, n in k.left_out.items() if n)
        lines.append(f"{k.kind}: {k.checked} checked of {k.episodes}, {_n(k.successes, 'success', 'successes')}"
                     + (f" (left out: {out})" if out else "") + f"\n  {k.status}: {k.why}")
    lines.extend(_method_text(m, names) for m in learned.candidates)
    return Result({"agent": agent.name, "kinds": [k.to_dict() for k in learned.kinds],
                   "candidates": [_method_dict(m, names) for m in learned.candidates],
                   "promoted": [_method_dict(m, names) for m in learned.promoted]},
                  "\n".join(lines) or f"no episodes in {agent.name}'s database")


@command("methods.list", MethodsLearn, "list an agent's methods: promoted ones, then the current candidates, "
         "with counts and confidence", read_only=True)
def methods_list(node: Node, p: MethodsLearn) -> Result:
    agent = node.agents.agent(p.agent)
    learned = _learned(agent)
    names = _names(node)
    methods = learned.methods()
    return Result({"agent": agent.name, "methods": [_method_dict(m, names) for m in methods]},
                  "\n".join(_method_text(m, names) for m in methods) or
                  f"no methods yet for {agent.name} (a kind needs 5 checked episodes, 3 successes, one tool sequence "
                  "behind 60 % of them: memmesh methods learn shows where each kind stands)")


@command("methods.promote", MethodsPromote, "promote a candidate method (signed by an admin of the agent's "
         "database): it is frozen, later learning never rewrites or demotes it")
def methods_promote(node: Node, p: MethodsPromote) -> Result:
    agent = node.agents.agent(p.agent)
    learned = _learned(agent)
    m = learned.find(p.method)
    if m is None:
        known = ", ".join(c.id for c in learned.candidates) or "none"
        raise UnknownMethod(f"no method {p.method} for {agent.name} (candidates now: {known}; memmesh methods list "
                            f"{agent.name} shows them)")
    if m.promotion is not None:
        raise AlreadyPromoted(f"method {m.id} was already promoted (entry {m.promotion.entry}); it is frozen")
    key = _signer(node, agent, p.as_, ADMIN)
    txn = agent.db.transaction(key)
    txn.append(METHODS_STORE, promote_value(m))
    entry = txn.commit()
    done = next((x for x in promoted(agent.db) if x.id == m.id), None)
    if done is None or done.promotion is None or done.promotion.entry != entry:  # the checks above are the fold's rules
        raise MemmeshError(f"the promotion entry {entry} was stored but does not count; memmesh explain {entry}")
    names = _names(node)
    return Result({"agent": agent.name, "entry": entry, "method": _method_dict(done, names)},
                  f"promoted {m.id} (entry {entry})\n" + _method_text(done, names))


@command("plan-context", PlanContext, "the planner's block for a task: similar past episodes and the methods "
         f"for their kinds (at most {MAX_CHARS:,} characters)", read_only=True)
def plan_context_command(node: Node, p: PlanContext) -> Result:
    agent = node.agents.agent(p.agent)
    block = plan_context(agent.db, p.task, limit=p.limit)
    return Result({"agent": agent.name, "block": block.text, "episodes": list(block.episodes),
                   "methods": list(block.methods), "not_shown": block.left_out},
                  block.text.rstrip("\n") or f"no past episode of {agent.name} is like this task")
