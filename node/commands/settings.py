"""config.yaml: reload, config.check, config.show (docs/operations.md, "Configuration")."""
from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Annotated, Any

import yaml
from pydantic import Field

from memmesh.node.commands.params import Cli, NoParams, Params
from memmesh.node.commands.registry import REGISTRY, command
from memmesh.node.commands.result import Result
from memmesh.node.settings import (
    APPLIED,
    CONFIG_FILE,
    MAX_CONFIG_BYTES,
    NodeConfig,
    applied,
    load_config,
    parse_config,
)

if TYPE_CHECKING:
    from memmesh.node.library import Node

INLINE = "the given config"
MAX_LABEL = 4096  # a path, shown back in messages and nothing else

REGISTRY.group("config", "check config.yaml, show the config in force")


@command("reload", NoParams, "read HOME/config.yaml again and apply it (what SIGHUP does to serve)")
def reload(node: Node, p: NoParams) -> Result:
    from memmesh.node.config_apply import reload_config

    done = reload_config(node)
    if done.changes:
        text = f"{done.file} applied: {len(done.changes)} change{'s' if len(done.changes) > 1 else ''}\n" \
               + "\n".join(f"  {c}" for c in done.changes)
    else:
        text = f"{done.file} applied: nothing changed"
    return Result({"file": done.file, "changes": done.changes}, text, done.warnings)


class ConfigCheck(Params):
    text: Annotated[str | None, Cli(positional=True, metavar="FILE", read="label"), Field(
        max_length=MAX_CONFIG_BYTES,
        description="the YAML to check, inline (the CLI reads FILE and sends its text); "
                    "default: HOME/config.yaml")] = None
    label: Annotated[str | None, Field(
        max_length=MAX_LABEL, pattern=r"^[^\x00-\x1f\x7f]*$",
        description="what messages call the text (the CLI gives FILE's path); default: 'the given config'")] = None


@command("config.check", ConfigCheck, "validate a config.yaml without applying it", read_only=True)
def config_check(node: Node, p: ConfigCheck) -> Result:
    # Never a path from the request: a serve that opened one would show any file it can read
    # to whoever can reach its API. The caller's own file comes as text (the CLI reads it).
    if p.text is None:
        path = node.home / CONFIG_FILE
        name, cfg = str(path), load_config(path)
    else:
        name = p.label or INLINE
        cfg = parse_config(p.text, name)
    e = cfg.embedding
    embedding = "as set by `memmesh embedder set`" if e is None else e.provider_name
    agents = ", ".join(a.name for a in cfg.agents) or "none"
    text = (f"{name}: ok (agents: {agents}; embedding: {embedding}; "
            f"sync peers: {len(cfg.sync.peers)}; interval {cfg.sync.interval_s:g} s, fanout {cfg.sync.fanout})")
    # Only the verdict: `config show` is how the config in force is read.
    return Result({"file": name, "ok": True, "agents": [a.name for a in cfg.agents]}, text)


DEFAULT, FILE, ENV = "default", "config.yaml", "environment"
# serve's flags, by the sync setting each one sets (node/serve_config.py's SyncFlags)
SERVE_FLAGS = {"listen": "--listen", "advertise": "--advertise", "discovery": "--no-discovery",
               "interval_s": "--interval", "fanout": "--fanout"}


def in_effect(node: Node) -> tuple[dict[str, Any], dict[str, str]]:
    """The config in force, with what a running serve changed in it (its flags, the addresses
    it bound, an environment variable), and where each setting came from: ``default``,
    ``config.yaml``, ``command line (serve --FLAG)`` or ``environment (VAR)``. A value that
    config.yaml sets to the default shows as the default."""
    from memmesh.node.memory.agent_config import DEADLINE_ENV

    cfg = applied(node)
    data = cfg.model_dump(mode="json")
    defaults = NodeConfig().model_dump(mode="json")
    sources: dict[str, str] = {}
    for section, value in data.items():
        if isinstance(value, dict) and isinstance(defaults.get(section), dict):
            for key, v in value.items():
                sources[f"{section}.{key}"] = DEFAULT if v == defaults[section].get(key) else FILE
        else:
            sources[section] = DEFAULT if value == defaults.get(section) else FILE
    if os.environ.get(DEADLINE_ENV) is not None and sources["auto_recall.deadline_ms"] == DEFAULT:
        sources["auto_recall.deadline_ms"] = f"{ENV} ({DEADLINE_ENV})"
    info = node.serve_info
    live = node.network.config  # serve's LiveConfig while it runs (node/serve_config.py)
    flags, running = getattr(live, "flags", None), getattr(live, "running", None)
    if info is None or flags is None or running is None:
        return data, sources
    sync = data["sync"]
    for key, flag in SERVE_FLAGS.items():
        if getattr(flags, key) is not None:
            sources[f"sync.{key}"] = f"command line (serve {flag})"
        sync[key] = getattr(running, key)
    sync["peers"] = list(running.peers)
    if info.get("sync"):
        sync["listen"] = info["sync"]  # as bound: port 0 became a port
    sync["discovery"] = info.get("discovery", sync["discovery"])
    if info.get("api_flag") is not None:
        sources["api.listen"] = "command line (serve --api-listen)"
    data["api"]["listen"] = info.get("api") or "off"
    return data, sources


def _annotated(data: dict[str, Any], sources: dict[str, str]) -> str:
    """``data`` as YAML, each setting's line followed by where its value came from."""
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True).rstrip()
    lines, section = [], ""
    for line in text.splitlines():
        top = re.match(r"^([a-z_]+):", line)
        inner = re.match(r"^  ([a-z_]+):", line)
        path = top.group(1) if top else f"{section}.{inner.group(1)}" if inner else None
        if top:
            section = top.group(1)
        source = sources.get(path) if path else None
        lines.append(f"{line}  # {source}" if source else line)
    return "\n".join(lines)


@command("config.show", NoParams, "print the config in force as YAML, and where each setting comes from",
         read_only=True)
def config_show(node: Node, p: NoParams) -> Result:
    data, sources = in_effect(node)
    text = _annotated(data, sources)
    info = node.serve_info
    if info is not None:
        text = f"# in force in serve (pid {info.get('pid', '?')}), with its command line\n" + text
    else:
        text = "# serve is not running: what it starts with, unless its command line says otherwise\n" + text
        if node.registry.config(APPLIED) is None:
            text = "# no config.yaml applied yet: the defaults\n" + text
    return Result({**data, "sources": sources, "serving": info is not None}, text)
