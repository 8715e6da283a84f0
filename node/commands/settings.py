"""config.yaml: reload, config.check, config.show (docs/operations.md, "Configuration")."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import yaml
from pydantic import Field

from memmesh.node.commands.params import Cli, NoParams, Params
from memmesh.node.commands.registry import REGISTRY, command
from memmesh.node.commands.result import Result
from memmesh.node.settings import APPLIED, CONFIG_FILE, MAX_CONFIG_BYTES, applied, load_config, parse_config

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


@command("config.show", NoParams, "print the config in force as YAML", read_only=True)
def config_show(node: Node, p: NoParams) -> Result:
    data = applied(node).model_dump(mode="json")
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True).rstrip()
    if node.registry.config(APPLIED) is None:
        text = "# no config.yaml applied yet: the defaults\n" + text
    return Result(data, text)
