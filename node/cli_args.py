"""The `memmesh` argument parser, derived from the command registry, and back again.

Each registered command becomes a subcommand (``memory.new`` -> ``memmesh memory new``) whose
arguments are the fields of its parameter model: a field marked ``Cli(positional=True)`` is a
positional argument, any other an option. Choices come from ``Literal`` types, defaults from
the model (an argument not given is left out of the params, so the model's default applies).
A command therefore cannot exist on the command line without a handler, or the reverse, and
a parameter rule is never restated here.

The parser is built from the models' description (node/commands/cli_table.py, generated from
them and checked against them by a test), not from the models: `memmesh --help` and a command
sent to a running serve import neither pydantic nor the handlers. Values are judged by the
model where the command runs (in this process, or in serve), with the same message.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memmesh.auth.errors import MemmeshError
from memmesh.node.commands.json_input import loads

if TYPE_CHECKING:
    from memmesh.node.commands.registry import Registry

COMMAND = "command"  # the dest holding the chosen command's registry name
RESERVED = {COMMAND, "home", "json"}  # dests of the parser itself; no parameter may use one
SCALARS = {"int": int, "float": float}


class CommandLineError(MemmeshError):
    """A command-line value that cannot become a parameter (bad JSON, unset variable)."""


def table(registry: Registry | None = None) -> dict[str, Any]:
    """The CLI's description: the generated one, or (for a registry of tests) derived now."""
    if registry is None:
        from memmesh.node.commands.cli_table import TABLE

        return TABLE
    from memmesh.node.commands.describe import describe

    return describe(registry)


def commands(registry: Registry | None = None) -> dict[str, dict[str, Any]]:
    """Each command's description by name."""
    return {c["name"]: c for c in table(registry)["commands"]}


class OneLineParser(argparse.ArgumentParser):
    """A parser whose usage errors are one line, like every other error of the command line,
    naming where the full usage is (argparse prints the usage, 3 to 8 lines, first)."""

    def error(self, message: str) -> Any:  # argparse's signature: it never returns
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Parser(OneLineParser):
    """A command's parser whose arguments are added when it is first used (it parses its part
    of the command line, or shows its help): a command line names one command, and adding the
    arguments of all of them is most of what building the parser costs."""

    pending: list[dict[str, Any]] | None = None

    def _fill(self) -> None:
        fields, self.pending = self.pending, None
        for field in fields or ():
            _add_argument(self, field)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._fill()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._fill()
        return super().format_usage()

    def format_help(self) -> str:
        self._fill()
        return super().format_help()


def build_parser(registry: Registry | None = None, *, lazy: bool = False) -> argparse.ArgumentParser:
    """The `memmesh` parser. ``lazy``: each command's arguments are added when the command line
    reaches it (what the CLI runs with); otherwise all at once (to inspect the whole parser)."""
    spec = table(registry)
    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print machine-readable JSON")
    # Before or after the command (`memmesh restore SRC --home DIR`); not given: no attribute.
    common.add_argument("--home", type=Path, default=argparse.SUPPRESS,
                        help="node home directory (default: $MEMMESH_HOME or the per-user data directory)")

    p = OneLineParser(prog="memmesh", description="A peer-to-peer replicated memory node for AI agents.",
                      parents=[common])
    top = p.add_subparsers(dest="_level0", required=True, metavar="COMMAND", parser_class=_Parser)
    groups: dict[str, Any] = {}
    for cmd in spec["commands"]:
        *path, leaf = cmd["name"].split(".")
        parent = top
        for depth in range(len(path)):
            key = ".".join(path[:depth + 1])
            if key not in groups:
                help = spec["groups"].get(key, "")
                gp = parent.add_parser(path[depth], help=help, description=help, parents=[common])
                groups[key] = gp.add_subparsers(dest=f"_level{depth + 1}", required=True, metavar="ACTION",
                                                parser_class=_Parser)
            parent = groups[key]
        sp = parent.add_parser(leaf, help=cmd["help"], description=cmd["help"], parents=[common])
        sp.set_defaults(**{COMMAND: cmd["name"]})
        for field in cmd["fields"]:
            name = field["name"]
            if name in RESERVED or name.startswith("_level"):
                raise ValueError(f"{cmd['name']}: parameter {name!r} clashes with the parser's own {name!r}")
        sp.pending = list(cmd["fields"])
        if not lazy:
            sp._fill()
    return p


def _add_argument(sp: argparse.ArgumentParser, field: dict[str, Any]) -> None:
    name, kind = field["name"], field["kind"]
    required = field.get("required", False)
    kw: dict[str, Any] = {"default": argparse.SUPPRESS, "help": field.get("help")}
    if kind == "choice":
        kw["choices"] = field["choices"]
    elif kind == "scalar" and "type" in field:
        kw["type"] = SCALARS[field["type"]]
    if field.get("positional"):
        if kind != "choice":
            kw["metavar"] = field.get("metavar") or name
        if kind == "list":
            kw["nargs"] = "+" if required else "*"
        elif not required:
            kw["nargs"] = "?"
            if kind == "choice":
                # argparse checks a '?' positional's default against its choices: give it the
                # model's default rather than SUPPRESS.
                kw["default"] = field.get("default")
        sp.add_argument(name, **kw)
        return
    if kind == "bool":
        kw["action"] = "store_true"
    else:
        kw["metavar"] = field.get("metavar") or name.upper()
        if kind == "list":
            kw["action"] = "append"
            kw["help"] = f"{field['help']} (repeat the option for more)" if field.get("help") else None
    if required:
        kw["required"] = True
    sp.add_argument(field["flag"], dest=name, **kw)


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


def command_of(args: argparse.Namespace, registry: Registry | None = None) -> tuple[str, dict[str, Any]]:
    """The registry name and the JSON-compatible params that the parsed command line asks for."""
    cmd = commands(registry)[getattr(args, COMMAND)]
    given = vars(args)
    params: dict[str, Any] = {}
    for field in cmd["fields"]:
        name = field["name"]
        if name not in given:  # not on the command line: the model's default applies
            continue
        value = given[name]
        what = f"{name} ({field['help']})" if field.get("help") else name
        if field.get("env"):
            value = _from_env(value)
        elif field.get("read") and isinstance(value, str):
            params[field["read"]] = os.path.abspath(value)
            value = _from_file(value, field.get("max_length") or MAX_FILE_BYTES)
        elif field.get("path") and isinstance(value, str):
            value = os.path.abspath(value)
        elif field["kind"] == "dict":
            value = from_json(what, value)
        elif field.get("json"):
            value = [from_json(what, v) for v in value]
        params[name] = value
    return cmd["name"], params


def _from_env(var: str) -> str:
    value = os.environ.get(var)
    if value is None:
        raise CommandLineError(f"environment variable {var} is not set")
    return value


def from_json(what: str, text: str) -> Any:
    try:
        return loads(text)  # the HTTP API's rules: bounded nesting, no NaN, no key twice
    except ValueError as exc:
        raise CommandLineError(f"{what} is not valid JSON: {exc}") from None
