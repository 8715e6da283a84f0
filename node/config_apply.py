"""Applying config.yaml to a node, and reloading it (docs/operations.md, "Configuration").

``apply_config(node, cfg)`` first checks everything that could refuse (names that clash with
the node's agents and banks, a bank this node cannot grant on, an API-key variable that is not
set, an embedder that cannot be built), and only then changes anything, each step only when it
is not done already: a second apply of the same config writes no entry anywhere. An agent's
default banks are created, granted Write, referenced from its database and attached for every
session (auto-recall searches them). The config
becomes the config in force (``settings.applied``) once every step is done.

``reload_config(node)`` is what serve's start, SIGHUP and `memmesh reload` do: read
HOME/config.yaml (missing: the defaults), apply it, and hand it to the running serve
(``node.network.reconfigure``, a no-op without serve) for what changes live. Each outcome is
one log line: ``config.reloaded changes=[...]`` or ``config.error file=... line=... message=...``.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memmesh.auth.errors import MemmeshError
from memmesh.auth.permissions import holds
from memmesh.node.memory.agents import CONFIG_STORE, Agent, agent_state
from memmesh.node.registry import EMBEDDER_CONFIG, EMBEDDER_SECRET
from memmesh.node.settings import APPLIED, CONFIG_FILE, ConfigFileError, NodeConfig, applied, load_config

if TYPE_CHECKING:
    from memmesh.node.library import Node
    from memmesh.node.memory.embedders import EmbedderConfig

log = logging.getLogger("memmesh.config")
log.addHandler(logging.NullHandler())  # a library caller without logging set up sees only the exception

BANK_DESCRIPTION = "created from config.yaml"


@dataclass
class Reloaded:
    file: str
    changes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what needs a restart of serve


def reload_config(node: Node, *, event: str = "config.reloaded") -> Reloaded:
    """Read HOME/config.yaml, apply it, tell the running serve; ConfigFileError (logged) when it
    cannot be used, the config in force then stays as it was."""
    path = node.home / CONFIG_FILE
    try:
        try:
            cfg = load_config(path)
        except FileNotFoundError:
            cfg = NodeConfig()  # no file: the defaults
        except OSError as exc:
            raise ConfigFileError.at(path, None, f"cannot be read: {exc.strerror or exc}") from None
        try:
            changes = apply_config(node, cfg)
        except ConfigFileError:
            raise
        except MemmeshError as exc:  # a step refused after the checks passed (rare: a race, a disk)
            raise ConfigFileError.at(path, None, f"could not be applied: {exc}; the config in force is "
                                                 "unchanged (steps done before this one stay done)") from None
    except ConfigFileError as exc:
        _log(logging.WARNING, "config.error", file=exc.file or str(path), line=exc.line, message=exc.problem)
        raise
    warnings = node.network.reconfigure(cfg)
    fields: dict[str, Any] = {"file": str(path), "changes": changes}
    if warnings:
        fields["restart_needed"] = warnings
    _log(logging.INFO, event, **fields)
    return Reloaded(str(path), changes, warnings)


def _log(level: int, event: str, **fields: Any) -> None:
    # serve's log formatter writes ``fields`` as key=value (or JSON) on the event's one line
    log.log(level, event, extra={"fields": fields})


def apply_config(node: Node, cfg: NodeConfig) -> list[str]:
    """Make the node what ``cfg`` says; the changes made, for people (empty: nothing to do)."""
    old = applied(node)
    _check_names(node, cfg)
    embedder = _embedder_change(node, cfg)
    changes: list[str] = []
    for spec in cfg.agents:
        if node.registry.agent(spec.name) is None:
            node.agents.create_agent(spec.name)
            changes.append(f"agent {spec.name} created")
        agent = node.agents.agent(spec.name)
        for bank in spec.default_memory_banks:
            changes += _default_bank(node, agent, bank)
        changes += _attach_defaults(node, agent, spec.default_memory_banks)
    if embedder is not None:
        want, key = embedder
        node.set_embedder_config(want, api_key=key)
        changes.append(f"embedder set to {want.provider}" + (f"/{want.model}" if want.model else ""))
    changes += _differences(old, cfg)
    if node.registry.config(APPLIED) is None or not old.same_as(cfg):
        node.registry.set_config(APPLIED, cfg.model_dump(mode="json"))
    return changes


# ---------------------------------------------------------------------- checks (nothing changes)
def _check_names(node: Node, cfg: NodeConfig) -> None:
    """Refuse what the node's agents and banks make impossible, before anything is written."""
    for i, spec in enumerate(cfg.agents):
        if node.registry.bank(spec.name) is not None:
            raise cfg.error(("agents", i, "name"),
                            f"{spec.name!r} is a bank on this node; an agent needs a name of its own")
        rec = node.registry.agent(spec.name)
        key = str(node.load_key(rec.key_name).public) if rec is not None else None
        for j, name in enumerate(spec.default_memory_banks):
            loc = ("agents", i, "default_memory_banks", j)
            if node.registry.agent(name) is not None:
                raise cfg.error(loc, f"{name!r} is an agent on this node, not a bank")
            if node.registry.bank(name) is None:
                continue  # created by this config, with this node's own key: it can grant
            bank = node.agents.resolve(name)
            if key is not None and holds(bank.db.permission(key), "write"):
                continue  # nothing to grant
            held = bank.db.permission(str(bank.admin_key.public))
            if held is None or held.level != "admin":
                have = "no permission" if held is None else held.level
                raise cfg.error(loc, f"this node holds {have} on bank {name!r}, and granting {spec.name} write "
                                     "needs admin: import a ticket shared with --perm admin, or have an admin of "
                                     f"the bank grant {spec.name}'s key")


def _embedder_change(node: Node, cfg: NodeConfig) -> tuple[EmbedderConfig, str | None] | None:
    """The embedder config (and API key) to set, None when the node's is already the one asked
    for; ConfigFileError when the key's variable is unset or the embedder cannot be built."""
    from memmesh.node.memory.embedders import EmbedderConfig, EmbedderError, make_embedder

    e = cfg.embedding
    if e is None:
        return None
    want = EmbedderConfig(e.provider_name, model=e.model, api_base=e.api_base, timeout_s=e.timeout_s)
    key = None
    if e.api_key_env is not None:
        key = os.environ.get(e.api_key_env)
        if not key:
            raise cfg.error(("embedding", "api_key_env"),
                            f"environment variable {e.api_key_env} is {'empty' if key == '' else 'not set'} "
                            "(set it to the embedding service's API key in the environment serve runs in)")
    have = node.embedder_config()
    stored_key = node.registry.secret(EMBEDDER_SECRET)
    if ((have.provider, have.model, have.api_base, have.timeout_s, have.dim)
            == (want.provider, want.model, want.api_base, want.timeout_s, None)
            and node.registry.config(EMBEDDER_CONFIG) is not None and key in (None, stored_key)):
        return None
    try:
        make_embedder(want, api_key=key if key is not None else stored_key)  # builds; sends nothing
    except EmbedderError as exc:
        raise cfg.error(("embedding", "backend"), str(exc)) from None
    return want, key


# ---------------------------------------------------------------------- steps
def _default_bank(node: Node, agent: Agent, name: str) -> list[str]:
    """Bank ``name`` exists, ``agent`` holds Write (or more) on it, and its DB refers to it."""
    changes = []
    if node.registry.bank(name) is None:
        node.agents.create_bank(name, BANK_DESCRIPTION)
        changes.append(f"bank {name} created")
    bank = node.agents.resolve(name)
    perm = bank.db.permission(str(agent.key.public))
    if not holds(perm, "write"):
        node.agents.grant(name, agent.name, "write")  # the grant, then the reference
        return [*changes, f"{agent.name} granted write on bank {name}"]
    if bank.db.id not in agent_state(agent.db).refs:
        assert perm is not None
        node.agents.write_ref(agent, {"op": "add", "bank": bank.db.id, "name": bank.name, "perm": perm.level})
        changes.append(f"bank {name} referenced from {agent.name}'s database")
    return changes


def _attach_defaults(node: Node, agent: Agent, names: list[str]) -> list[str]:
    """Each default bank is attached for every session of ``agent`` (auto-recall searches it, as
    after `memory attach BANK --agent A`), in config order; the attachments missing are written
    in one entry of the agent's database, and none when every one is there. A bank detached by
    hand is attached again: the file is the floor."""
    attached = agent_state(agent.db).attached.get(None, [])
    missing: list[tuple[str, str]] = []
    for name in names:
        db_id = node.agents.resolve(name).db.id
        if db_id not in attached and db_id != agent.db.id and all(db_id != d for d, _ in missing):
            missing.append((db_id, name))
    if not missing:
        return []
    with agent.db.transaction(agent.key) as txn:
        for db_id, _ in missing:
            txn.append(CONFIG_STORE, {"attach": db_id, "session": None})
    return [f"bank {name} attached to {agent.name} (every session)" for _, name in missing]


def _differences(old: NodeConfig, new: NodeConfig) -> list[str]:
    """What changed in the profiles and the settings sections, for people."""
    out = []
    for spec in new.agents:
        was = old.agent(spec.name)
        if was is None:
            tools = ", ".join(spec.allowed_tools) or "none"
            out.append(f"agent {spec.name}: profile from config.yaml (allowed_tools: {tools})")
            continue
        if was.allowed_tools != spec.allowed_tools:
            out.append(f"agent {spec.name}: allowed_tools {', '.join(was.allowed_tools) or 'none'} -> "
                       f"{', '.join(spec.allowed_tools) or 'none'}")
        if was.system_prompt != spec.system_prompt:
            out.append(f"agent {spec.name}: system_prompt changed")
    out += [f"agent {was.name}: no longer in config.yaml, so it has no profile (every tool allowed, "
            "no system prompt); the agent and its memories stay" for was in old.agents if new.agent(was.name) is None]
    for section in ("sync", "api", "auto_recall", "memory"):
        before, after = getattr(old, section).model_dump(mode="json"), getattr(new, section).model_dump(mode="json")
        out += [f"{section}.{k}: {json.dumps(before[k])} -> {json.dumps(after[k])}"
                for k in after if before[k] != after[k]]
    if old.embedding is not None and new.embedding is None:
        out.append("embedding: no longer in config.yaml; the embedder stays as it is")
    return out
