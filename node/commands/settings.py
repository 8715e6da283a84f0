"""config.yaml: reload, config.check, config.show (docs/operations.md, "Configuration")."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import yaml
from pydantic import Field

from node.commands.params import Cli, NoParams, Params
from node.commands.registry import REGISTRY, command
from node.commands.result import Result
from node.settings import APPLIED, CONFIG_FILE, applied, load_config

if TYPE_CHECKING:
    from node.library import Node

REGISTRY.group("config", "check config.yaml, show the config in force")


@command("reload", NoParams, "read HOME/config.yaml again and apply it (what SIGHUP does to serve)")
def reload(node: "Node", p: NoParams) -> Result:
    from node.config_apply import reload_config

    done = reload_config(node)
    if done.changes:
        text = f"{done.file} applied: {len(done.changes)} change{'s' if len(done.changes) > 1 else ''}\n" \
               + "\n".join(f"  {c}" for c in done.changes)
    else:
        text = f"{done.file} applied: nothing changed"
    return Result({"file": done.file, "changes": done.changes}, text, done.warnings)


class ConfigCheck(Params):
    file: Annotated[str | None, Cli(positional=True, metavar="FILE", path=True), Field(
        description="the file to check; default: HOME/config.yaml")] = None


@command("config.check", ConfigCheck, "validate a config.yaml without applying it", read_only=True)
def config_check(node: "Node", p: ConfigCheck) -> Result:
    path = Path(p.file) if p.file is not None else node.home / CONFIG_FILE
    cfg = load_config(path)
    e = cfg.embedding
    embedding = "as set by `memmesh embedder set`" if e is None else e.provider_name
    agents = ", ".join(a.name for a in cfg.agents) or "none"
    text = (f"{path}: ok (agents: {agents}; embedding: {embedding}; "
            f"sync peers: {len(cfg.sync.peers)}; interval {cfg.sync.interval_s:g} s, fanout {cfg.sync.fanout})")
    # Only the verdict: the file may be anyone's YAML, and `config show` is how the config in force is read.
    return Result({"file": str(path), "ok": True, "agents": [a.name for a in cfg.agents]}, text)


@command("config.show", NoParams, "print the config in force as YAML", read_only=True)
def config_show(node: "Node", p: NoParams) -> Result:
    data = applied(node).model_dump(mode="json")
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True).rstrip()
    if node.registry.config(APPLIED) is None:
        text = "# no config.yaml applied yet: the defaults\n" + text
    return Result(data, text)
