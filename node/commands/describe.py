"""The CLI's description of the commands, generated from the registry's models.

`memmesh --help` and a command sent to a running serve need each command's name, help and
policy, and its parameters' command-line shape: not the models, whose import (pydantic, the
handlers' numpy and aiohttp) costs many times what parsing does. node/commands/cli_table.py
holds that description as a Python literal, written by

    python -m memmesh.node.commands.describe

and tests/test_cli_table.py fails whenever it differs from what this module derives from the
models, so it cannot drift from them.
"""
from __future__ import annotations

import pprint
import sys
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from memmesh.node.commands.registry import Command, Registry
from memmesh.node.commands.shape import cli_of, max_length, option_flag, shape

TABLE_FILE = Path(__file__).with_name("cli_table.py")
HEADER = '''"""The CLI's description of every command (name, help, policy, parameters' command-line shape).

Generated from the registry's models by `python -m memmesh.node.commands.describe`; do not edit.
tests/test_cli_table.py fails when it differs from them. Read by node/cli_args.py, which builds
the parser from it without importing the models.
"""
'''


def describe_field(name: str, field: FieldInfo) -> dict[str, Any]:
    """What the parser and ``command_of`` need of one field; keys at their default are left out."""
    cli = cli_of(field)
    kind, detail = shape(field.annotation)
    out: dict[str, Any] = {"name": name, "kind": kind}
    if kind == "choice":
        out["choices"] = detail
    elif kind == "scalar" and detail is not str:
        out["type"] = detail.__name__
    elif kind == "list" and detail == "json":
        out["json"] = True
    if cli.positional:
        out["positional"] = True
    else:
        out["flag"] = option_flag(name, field)
    if cli.metavar:
        out["metavar"] = cli.metavar
    if field.is_required():
        out["required"] = True
    elif cli.positional and kind == "choice":
        out["default"] = field.default
    if field.description:
        out["help"] = field.description
    for marker in ("env", "path"):
        if getattr(cli, marker):
            out[marker] = True
    if cli.read:
        out["read"] = cli.read
        bound = max_length(field)
        if bound is not None:
            out["max_length"] = bound
    return out


def describe_command(cmd: Command) -> dict[str, Any]:
    out: dict[str, Any] = {"name": cmd.name, "help": cmd.help, "runs": cmd.runs}
    if cmd.standalone:
        out["standalone"] = True
    # The module that registers it: a process running this one command imports only that.
    out["module"] = _module(cmd)
    out["fields"] = [describe_field(name, field) for name, field in cmd.params.model_fields.items()]
    return out


def in_help_order(registry: Registry) -> list[Command]:
    """The commands in the help's order: by handler module as node/commands lists them
    (HANDLER_MODULES), then as each module registers them. Not the registry's own order, which
    is whichever module some caller imported first, so the table never depends on it."""
    from memmesh.node.commands import HANDLER_MODULES

    rank = {f"memmesh.node.commands.{name}": i for i, name in enumerate(HANDLER_MODULES)}
    listed = list(registry)
    return sorted(listed, key=lambda c: (rank.get(_module(c), len(rank)), listed.index(c)))


def _module(cmd: Command) -> str:
    """The module that registers ``cmd``: its handler's (a declared transport has no handler;
    its model lives with it)."""
    return cmd.handler.__module__ if cmd.handler is not None else cmd.params.__module__


def describe(registry: Registry) -> dict[str, Any]:
    """The description of every command of ``registry`` and of its groups, in the help's order."""
    commands = in_help_order(registry)
    groups: dict[str, str] = {}
    for cmd in commands:
        path = cmd.name.split(".")[:-1]
        for depth in range(len(path)):
            key = ".".join(path[:depth + 1])
            groups.setdefault(key, registry.group_help(key))
    return {"groups": groups, "commands": [describe_command(cmd) for cmd in commands]}


def table_source(registry: Registry) -> str:
    """The text of node/commands/cli_table.py for ``registry``."""
    body = pprint.pformat(describe(registry), width=120, sort_dicts=False)
    return f"{HEADER}from typing import Any\n\nTABLE: dict[str, Any] = {body}\n"


def main() -> int:
    from memmesh.node.commands import load

    text = table_source(load())
    if TABLE_FILE.exists() and TABLE_FILE.read_text() == text:
        print(f"{TABLE_FILE} is up to date")
        return 0
    TABLE_FILE.write_text(text)
    print(f"wrote {TABLE_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
