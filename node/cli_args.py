"""The `memmesh` argument parser, derived from the command registry, and back again.

Each registered command becomes a subcommand (``memory.new`` -> ``memmesh memory new``) whose
arguments are the fields of its parameter model: a field marked ``Cli(positional=True)`` is a
positional argument, any other an option. Choices come from ``Literal`` types, defaults from
the model (an argument not given is left out of the params, so the model's default applies).
A command therefore cannot exist on the command line without a handler, or the reverse, and
a parameter rule is never restated here.
"""
from __future__ import annotations

import argparse
import os
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from memmesh.auth.errors import MemmeshError
from memmesh.node.commands import REGISTRY, Command
from memmesh.node.commands.params import Cli, loads
from memmesh.node.commands.registry import Registry

COMMAND = "command"  # the dest holding the chosen command's registry name
RESERVED = {COMMAND, "home", "json"}  # dests of the parser itself; no parameter may use one


class CommandLineError(MemmeshError):
    """A command-line value that cannot become a parameter (bad JSON, unset variable)."""


def build_parser(registry: Registry = REGISTRY) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print machine-readable JSON")
    # Before or after the command (`memmesh restore SRC --home DIR`); not given: no attribute.
    common.add_argument("--home", type=Path, default=argparse.SUPPRESS,
                        help="node home directory (default: $MEMMESH_HOME or the per-user data directory)")

    p = argparse.ArgumentParser(prog="memmesh", description="A peer-to-peer replicated memory node for AI agents.",
                                parents=[common])
    top = p.add_subparsers(dest="_level0", required=True, metavar="COMMAND")
    groups: dict[str, Any] = {}
    for cmd in registry:
        *path, leaf = cmd.name.split(".")
        parent = top
        for depth in range(len(path)):
            key = ".".join(path[:depth + 1])
            if key not in groups:
                help = registry.group_help(key)
                gp = parent.add_parser(path[depth], help=help, description=help, parents=[common])
                groups[key] = gp.add_subparsers(dest=f"_level{depth + 1}", required=True, metavar="ACTION")
            parent = groups[key]
        sp = parent.add_parser(leaf, help=cmd.help, description=cmd.help, parents=[common])
        sp.set_defaults(**{COMMAND: cmd.name})
        for name, field in cmd.params.model_fields.items():
            if name in RESERVED or name.startswith("_level"):
                raise ValueError(f"{cmd.name}: parameter {name!r} clashes with the parser's own {name!r}")
            _add_argument(sp, name, field)
    return p


def _cli(field: FieldInfo) -> Cli:
    return next((m for m in field.metadata if isinstance(m, Cli)), Cli())


def option_flag(name: str, field: FieldInfo) -> str:
    """The option that sets a non-positional field (the chat grammar names options the same way)."""
    return _cli(field).flag or "--" + name.replace("_", "-")


def _shape(annotation: Any) -> tuple[str, Any]:
    """("bool" | "list" | "dict" | "choice" | "scalar", detail) for a field's type, None aside."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        if len(args) != 1:
            return "scalar", str  # several types (a config value): the text as typed
        annotation = args[0]
    origin = typing.get_origin(annotation)
    if annotation is bool:
        return "bool", None
    if origin is list:
        # A list of objects (edges): each repetition of the option is one JSON object.
        (item,) = typing.get_args(annotation) or (str,)
        objects = item is dict or typing.get_origin(item) is dict or (isinstance(item, type) and issubclass(item, BaseModel))
        return "list", "json" if objects else None
    if annotation is dict or origin is dict:
        return "dict", None
    if origin is typing.Literal:
        return "choice", list(typing.get_args(annotation))
    return "scalar", annotation if annotation in (int, float) else str


def _add_argument(sp: argparse.ArgumentParser, name: str, field: FieldInfo) -> None:
    cli = _cli(field)
    kind, detail = _shape(field.annotation)
    kw: dict[str, Any] = {"default": argparse.SUPPRESS, "help": field.description}
    if kind == "choice":
        kw["choices"] = detail
    elif kind == "scalar" and detail is not str:
        kw["type"] = detail
    if cli.positional:
        if kind != "choice":
            kw["metavar"] = cli.metavar or name
        if kind == "list":
            kw["nargs"] = "+" if field.is_required() else "*"
        elif not field.is_required():
            kw["nargs"] = "?"
            if kind == "choice":
                # argparse checks a '?' positional's default against its choices: give it the
                # model's default rather than SUPPRESS.
                kw["default"] = field.default
        sp.add_argument(name, **kw)
        return
    flag = option_flag(name, field)
    if kind == "bool":
        kw["action"] = "store_true"
    else:
        kw["metavar"] = cli.metavar or name.upper()
        if kind == "list":
            kw["action"] = "append"
            kw["help"] = f"{field.description} (repeat the option for more)" if field.description else None
    if field.is_required():
        kw["required"] = True
    sp.add_argument(flag, dest=name, **kw)


MAX_FILE_BYTES = 16 << 20  # a parameter read from a file with no bound of its own


def _from_file(path: str, limit: int = MAX_FILE_BYTES) -> str:
    """The text of a file the command line names, read here, in the caller's process: at most
    ``limit`` bytes (the parameter's own bound), so /dev/zero or an endless pipe is refused
    rather than read until memory runs out."""
    with open(path, "rb") as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise CommandLineError(f"{os.path.abspath(path)} is larger than {limit:,} bytes, more than this "
                               "parameter takes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise CommandLineError(f"{os.path.abspath(path)}:{line}: is not UTF-8 text") from None


def _max_length(field: FieldInfo) -> int | None:
    return next((m.max_length for m in field.metadata if getattr(m, "max_length", None) is not None), None)


def command_of(args: argparse.Namespace, registry: Registry = REGISTRY) -> tuple[str, dict[str, Any]]:
    """The registry name and the JSON-compatible params that the parsed command line asks for."""
    cmd: Command = registry.get(getattr(args, COMMAND))
    given = vars(args)
    params: dict[str, Any] = {}
    for name, field in cmd.params.model_fields.items():
        if name not in given:  # not on the command line: the model's default applies
            continue
        value = given[name]
        if _cli(field).env:
            value = _from_env(value)
        elif _cli(field).read and isinstance(value, str):
            params[_cli(field).read] = os.path.abspath(value)
            value = _from_file(value, _max_length(field) or MAX_FILE_BYTES)
        elif _cli(field).path and isinstance(value, str):
            value = os.path.abspath(value)
        elif _shape(field.annotation)[0] == "dict":
            value = _from_json(f"{name} ({field.description})" if field.description else name, value)
        elif _shape(field.annotation) == ("list", "json"):
            value = [_from_json(f"{name} ({field.description})" if field.description else name, v) for v in value]
        params[name] = value
    return cmd.name, params


def _from_env(var: str) -> str:
    value = os.environ.get(var)
    if value is None:
        raise CommandLineError(f"environment variable {var} is not set")
    return value


def _from_json(what: str, text: str) -> Any:
    try:
        return loads(text)  # the HTTP API's rules: bounded nesting, no NaN, no key twice
    except ValueError as exc:
        raise CommandLineError(f"{what} is not valid JSON: {exc}") from None
