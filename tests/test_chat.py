"""The `/memory ...` chat commands: the parser (node/chat.py) and the `command` registry command,
against real homes; import from a real loopback sync server (tests/test_sharing.py's issuer)."""
from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import pytest
from pydantic import Field

from memmesh.auth.errors import MemmeshError
from memmesh.node import Node, chat
from memmesh.node.cli import main
from memmesh.node.commands import REGISTRY, ParamsError, Result
from memmesh.node.commands.params import Cli, Params
from memmesh.node.commands.registry import Registry
from memmesh.node.memory.agents import CONFIG_DEFAULTS, agent_state
from memmesh.tickets import decode
from tests.test_registry import snapshot
from tests.test_sharing import issuer  # noqa: F401  (the fixture: a node serving its sync API)

PEER = "ed25519:Kay64UG8yvCyLhqU000LxzYeUm0L_hLIl5S8kyKWbdc"


@pytest.fixture
def node(node):
    """conftest's node (alpha, no embedder), a second agent, beta, and a bank, notes."""
    node.run("agent.new", {"name": "beta"})
    node.run("memory.new", {"name": "notes"})
    return node


def say(node: Node, line: str, *, agent: str = "alpha", session: str | None = None, events: Any = None) -> Result:
    return node.run("command", {"agent": agent, "line": line, "session": session}, events=events)


def state(node: Node) -> dict:
    """What a chat command could change, sharing included."""
    return {**snapshot(node), "shared": sorted(node.sync.shared())}


def bank_names(node: Node) -> dict[str, str]:
    return {r.name: r.description for r in node.registry.banks()}


# ---------------------------------------------------------------------------------- the grammar


def test_every_memory_command_is_a_subcommand_and_help_lists_them():
    # Every memory.* command, and the commands declared for chat outside the group (forget).
    memory = [c.name for c in REGISTRY if c.name.startswith("memory.") or c.chat]
    assert [g.command for g in chat.grammars()] == memory
    assert [c.name for c in REGISTRY if c.chat and not c.name.startswith("memory.")] == ["forget"]
    assert {"memory.new", "memory.list", "memory.delete", "memory.grant", "memory.revoke", "memory.share",
            "memory.unshare", "memory.import", "memory.attach", "memory.detach", "memory.config",
            "memory.reindex"} <= set(memory)
    for name, fields in chat.FROM_CALLER.items():
        assert set(fields) <= set(REGISTRY.get(name).params.model_fields) and set(fields) <= {"agent", "session"}
    data, text = chat.help_text()
    assert [s["command"] for s in data["subcommands"]] == memory
    for cmd in memory:
        assert chat.usage(cmd) in text and REGISTRY.get(cmd).help in text


@pytest.mark.parametrize("command, usage", [
    ("memory.new", "/memory new NAME [DESCRIPTION]"),
    ("memory.grant", "/memory grant BANK WHO read|write"),  # WHO: an agent, a key or a label
    ("memory.attach", "/memory attach BANK"),  # agent and session: the caller's
    ("memory.config", "/memory config show|set|reset [KEY] [VALUE]"),
    ("memory.share", "/memory share BANK [--perm admin|write|read] [--for PEERKEY] [--expires DURATION]"),
    ("memory.import", "/memory import TICKET [admin|write|read] [--name NAME]"),
])
def test_usage_is_generated_from_the_model(command, usage):
    assert chat.usage(command) == usage


@pytest.mark.parametrize("line, command, params", [
    ("/memory new team-notes Shared notes", "memory.new", {"name": "team-notes", "description": "Shared notes"}),
    ("/memory new team-notes 'two  spaces'", "memory.new", {"name": "team-notes", "description": "two  spaces"}),
    ("/memory new team-notes -- --not an option", "memory.new", {"name": "team-notes", "description": "--not an option"}),
    ("  !memmesh memory grant notes beta read ", "memory.grant", {"bank": "notes", "agent": "beta", "perm": "read"}),
    ("/memory share notes --perm=read --for K --expires 1d", "memory.share",
     {"bank": "notes", "perm": "read", "recipient": "K", "expires": "1d"}),
    ("/memory import memmesh:?db=x&perm=read#secret=y", "memory.import", {"ticket": "memmesh:?db=x&perm=read#secret=y"}),
    ("/memory attach notes", "memory.attach", {"bank": "notes", "agent": "alpha", "session": "s1"}),
    ("/memory config set auto_recall_banks notes, other", "memory.config",
     {"agent": "alpha", "action": "set", "key": "auto_recall_banks", "value": "notes, other"}),
    ("/memory reindex", "memory.reindex", {}),
    ("/memory", None, {"topic": None}),
    ("/memory help grant", None, {"topic": "grant"}),
])
def test_words_map_to_fields(line, command, params):
    assert chat.parse(line, agent="alpha", session="s1") == (command, params)


def test_a_caller_without_a_session_leaves_the_default():
    assert chat.parse("/memory detach notes", agent="alpha") == ("memory.detach", {"bank": "notes", "agent": "alpha"})


class Probe(Params):
    """Every field shape the CLI knows, to check the chat grammar follows the same markers."""

    words: Annotated[list[str], Cli(positional=True), Field(description="words")]
    loud: Annotated[bool, Field(description="a switch")] = False
    tags: Annotated[list[str] | None, Cli(flag="--tag"), Field(description="repeatable")] = None
    limit: Annotated[int, Field(description="a number")] = 10
    args: Annotated[dict | None, Field(description="JSON")] = None
    secret_env: Annotated[str | None, Cli(env=True), Field(description="from the environment")] = None


def test_the_grammar_follows_every_field_shape():
    reg = Registry()
    reg.command("memory.probe", Probe, "probe")(lambda node, p: Result({}, ""))
    assert chat.usage("memory.probe", reg) == ("/memory probe WORDS [--loud] [--tag TAGS]... [--limit LIMIT] "
                                              "[--args ARGS]")
    assert chat.parse("""/memory probe a b --loud --tag x --tag y --limit 5 --args '{"k": 1}'""", agent="z", registry=reg) \
        == ("memory.probe", {"words": ["a", "b"], "loud": True, "tags": ["x", "y"], "limit": 5, "args": {"k": 1}})
    # A word that is not a number is left for the model to refuse, in its own words.
    assert chat.parse("/memory probe a --limit ten", agent="z", registry=reg)[1]["limit"] == "ten"
    with pytest.raises(chat.ChatUsageError, match="limit should be a valid integer.*usage: /memory probe"):
        chat.check("memory.probe", {"words": ["a"], "limit": "ten"}, reg)
    for line, says in [("/memory probe a --args {", "args is not valid JSON"),
                       ("/memory probe a --loud=yes", "--loud takes no value"),
                       ("/memory probe a --secret-env HOME", "unknown option --secret-env")]:
        with pytest.raises(chat.ChatUsageError, match=says):
            chat.parse(line, agent="z", registry=reg)


# ---------------------------------------------------------------------------------- each subcommand


def test_new_list_delete(node):
    out = say(node, "/memory new team-notes Shared notes")
    assert bank_names(node)["team-notes"] == "Shared notes" and "bank team-notes created" in out.text
    say(node, "!memmesh memory new other 'kept  as typed'")
    assert bank_names(node)["other"] == "kept  as typed"
    listed = say(node, "/memory list")
    assert {b["name"] for b in listed.data["banks"]} == {"notes", "team-notes", "other"}
    assert "team-notes" in listed.text
    say(node, "/memory delete team-notes")
    assert "team-notes" not in bank_names(node)
    assert [a.name for a in node.registry.archived_banks()] == ["team-notes"]


def test_grant_and_revoke_name_their_agent(node):
    beta = str(node.agents.agent("beta").key.public)
    db = node.agents.resolve("notes").db
    out = say(node, "/memory grant notes beta read")  # the caller is alpha; beta is granted
    assert db.permission(beta).level == "read" and out.text == "granted read on notes to beta"
    assert db.settings().get(str(node.agents.agent("alpha").key.public)) is None
    say(node, "/memory revoke notes beta")
    assert db.settings().get(beta).status == "revoked" and db.permission(beta) is None


def test_attach_and_detach_apply_to_the_callers_session(node):
    notes = node.agents.resolve("notes").db.id
    out = say(node, "/memory attach notes", session="s1")
    assert agent_state(node.agents.agent("alpha").db).attached == {"s1": [notes]}
    assert out.data["session"] == "s1" and "session s1" in out.text
    assert agent_state(node.agents.agent("beta").db).attached == {}
    say(node, "/memory attach notes", agent="beta")  # no session: every session
    assert agent_state(node.agents.agent("beta").db).attached == {None: [notes]}
    say(node, "/memory detach notes", session="s1")
    assert agent_state(node.agents.agent("alpha").db).attached == {"s1": []}


def test_config_show_set_reset_for_the_caller(node):
    node.run("memory.new", {"name": "other"})
    shown = say(node, "/memory config show")
    assert shown.data["config"]["max_entries"] == CONFIG_DEFAULTS["max_entries"]
    say(node, "/memory config set max_entries 7")
    say(node, "/memory config set auto_recall_banks notes, other")  # the value takes the rest of the line
    config = agent_state(node.agents.agent("alpha").db).config
    ids = [node.agents.resolve(n).db.id for n in ("notes", "other")]
    assert config["max_entries"] == 7 and config["auto_recall_banks"] == ids
    assert agent_state(node.agents.agent("beta").db).config == CONFIG_DEFAULTS
    say(node, "/memory config reset")
    assert agent_state(node.agents.agent("alpha").db).config == CONFIG_DEFAULTS


def test_reindex_streams_its_progress(node):
    node.call_tool("alpha", "remember", {"key": "deploy", "value": "nix build"})
    node.run("embedder.set", {"provider": "hashed"})
    events: list = []
    out = say(node, "/memory reindex alpha", events=events.append)
    assert out.data["embedded"] == 1 and events[-1] == {"event": "progress", "bank": "alpha", "done": 1, "total": 1}
    assert node.memory.view(node.agents.agent("alpha").db).missing_vectors() == []


def test_share_and_unshare(node):
    notes = node.agents.resolve("notes").db.id
    out = say(node, f"/memory share notes --perm read --for {PEER} --expires 1d")
    ticket = decode(out.data["ticket"])
    assert (ticket.db, ticket.perm, ticket.recipient) == (notes, "read", PEER)
    assert node.sync.shared() == [notes] and out.text.startswith(out.data["ticket"])
    say(node, "/memory unshare notes")
    assert node.sync.shared() == []


async def test_import_a_ticket_from_a_serving_peer(issuer, tmp_path):  # noqa: F811
    ticket = issuer.run("command", {"agent": "alpha", "line": "/memory share project-notes --perm read"}).data["ticket"]
    b = Node.open(tmp_path / "b")
    try:
        b.run("embedder.set", {"provider": "none"})
        b.run("agent.new", {"name": "gamma"})
        # The import reaches the issuer over HTTP, served by this test's loop: run it beside it.
        line = f"/memory import {ticket} read --name team"  # unquoted: '#secret=' is not a comment
        out = await asyncio.to_thread(b.run, "command", {"agent": "gamma", "line": line})
        assert (out.data["name"], out.data["perm"]) == ("team", "read")
        assert [r.value["value"] for r in b.agents.resolve("team").db.rows("memory")] == ["one DB per conversation"]
    finally:
        b.close()


def test_help(node):
    before = state(node)
    for line in ("/memory", "/memory help", "!memmesh memory help"):
        out = say(node, line)
        assert "/memory grant BANK WHO read|write" in out.text and len(out.data["subcommands"]) >= 12
    one = say(node, "/memory help attach")
    assert one.text.startswith("usage: /memory attach BANK") and one.data["from_caller"] == ["agent", "session"]
    assert "BANK: a bank name" in one.text
    assert state(node) == before


# ---------------------------------------------------------------------------------- refused lines


@pytest.mark.parametrize("line, says", [
    ("/memory grant notes beta", "missing read|write; usage: /memory grant BANK WHO read|write"),
    ("/memory new", "missing NAME; usage: /memory new NAME [DESCRIPTION]"),
    ("/memory config", "missing show|set|reset; usage: /memory config"),
    ("/memory frobnicate notes", "unknown /memory subcommand 'frobnicate'; subcommands: new, list"),
    ("/memory help frobnicate", "unknown /memory subcommand 'frobnicate'"),
    ("/memory grant notes beta admin",
     "/memory grant: perm should be 'read' or 'write' (got 'admin'); usage: /memory grant BANK WHO read|write"),
    ("/memory config frob", "action should be 'show', 'set' or 'reset' (got 'frob'); usage: /memory config"),
    ("/memory config set max_entries", "set needs a key and a value; usage: /memory config"),
    ("/memory share notes --perm owner", "perm should be 'admin', 'write' or 'read'"),
    ("/memory share notes --colour red", "unknown option --colour (takes --perm, --for, --expires); usage: /memory share"),
    ("/memory attach notes --agent beta", "unknown option --agent (takes no options); usage: /memory attach BANK"),
    ("/memory share notes --expires", "--expires needs DURATION; usage: /memory share"),
    ("/memory share notes --perm read --perm write", "--perm is given twice"),
    ("/memory grant notes beta read now", "unexpected 'now'; usage: /memory grant BANK WHO read|write"),
    ("/memory list everything", "unexpected 'everything'; usage: /memory list"),
    ('/memory new notes2 "Shared notes', "unbalanced quote (no closing quotation)"),
    ("/memory new notes2 Alice's notes", "unbalanced quote"),
    ("remember this", "a memory command starts with /memory or !memmesh memory (got 'remember this')"),
    ("/memorynew x", "a memory command starts with /memory"),
    ("!memmesh recall x", "a memory command starts with /memory"),
    ("", "a memory command starts with /memory"),
])
def test_usage_errors_say_what_was_expected_and_change_nothing(node, line, says):
    before = state(node)
    with pytest.raises(chat.ChatUsageError) as err:
        say(node, line, session="s1")
    assert says in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, ParamsError)
    assert state(node) == before


def test_the_node_refuses_what_only_it_can_judge_and_changes_nothing(node):
    before = state(node)
    for agent, line, says in [("nobody", "/memory new team", "no agent named 'nobody'"),
                              ("alpha", "/memory grant nothing beta read", "nothing"),
                              ("alpha", "/memory config set max_entries 99", "max_entries is a whole number"),
                              ("alpha", "/memory share notes --expires 5x", "expires must be a duration such as 30m")]:
        with pytest.raises(MemmeshError, match=says):
            say(node, line, agent=agent)
    assert state(node) == before


# ---------------------------------------------------------------------------------- the CLI


def test_the_cli_runs_a_line(tmp_path, capsys):
    home = tmp_path / "cli"
    with Node.open(home) as n:
        n.run("embedder.set", {"provider": "none"})
        n.run("agent.new", {"name": "alpha"})
    assert main(["--home", str(home), "command", "alpha", "/memory new team-notes Shared notes"]) == 0
    assert main(["--home", str(home), "--json", "command", "alpha", "/memory list"]) == 0
    listed = json.loads(capsys.readouterr().out.split("\n", 2)[2])
    assert [(b["name"], b["description"]) for b in listed["banks"]] == [("team-notes", "Shared notes")]
    assert main(["--home", str(home), "command", "alpha", "/memory grant team-notes alpha"]) == 1
    err = capsys.readouterr().err
    assert err == "memmesh: error: missing read|write; usage: /memory grant BANK WHO read|write\n"
