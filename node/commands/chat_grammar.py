"""The `/memory <sub> ...` chat command text, parsed to a registry command and its params.

    parse("/memory new team-notes Shared notes", agent="alpha", session="s1")
        -> ("memory.new", {"name": "team-notes", "description": "Shared notes"})

Sans-IO: words in, (command name, JSON-compatible params) out; running them is the caller's
(the ``command`` registry command, node/commands/chat.py). The grammar is derived from the
registry, like the CLI's (node/cli_args.py): every command whose policy lets chat callers run it
(``Command.chat``: the ``memory.*`` commands) is a subcommand, its
``Cli(positional=True)`` fields are positional words in model order, its other fields options
named as on the command line. The parser only maps words to fields; whether a value is
acceptable is the registry's to say (``REGISTRY.run`` validates), so a rule is never restated.

Chat-only rules: both prefixes ``/memory`` and ``!memmesh memory``; words are split as a shell
would (shlex), ``--`` ends the options; when more words follow than there are positional
fields, the last positional field takes the rest of the line if it is text; some fields come
from the caller rather than the text (``Command.from_caller``, collected in ``FROM_CALLER``).

It sits in the commands package, beside the ``command`` command (node/commands/chat.py) that
runs a line: that handler needs it, and the commands import no transport. node/chat.py is its
public name.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from pydantic.fields import FieldInfo

from memmesh.node.commands.json_input import loads
from memmesh.node.commands.params import Params, ParamsError
from memmesh.node.commands.params import parse as validate
from memmesh.node.commands.registry import Command, Registry
from memmesh.node.commands.shape import cli_of, option_flag, shape

PREFIXES = (("/memory",), ("!memmesh", "memory"))
GROUP = "memory"  # the registry group whose commands are the subcommands
HELP = "help"



def _registry(registry: Registry | None) -> Registry:
    if registry is not None:
        return registry
    from memmesh.node.commands import load  # the handler modules register the commands

    return load()


def __getattr__(name: str) -> Any:
    if name == "FROM_CALLER":
        # Fields the caller's context supplies instead of the text, by command: declared on
        # each command (``from_caller``), gathered here for readers of the grammar.
        return {cmd.name: cmd.from_caller for cmd in _registry(None) if cmd.from_caller}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ChatUsageError(ParamsError):
    """A chat command line that does not fit the expected form; nothing was run."""


@dataclass(frozen=True)
class Slot:
    """One model field as the chat text gives it."""

    field: str
    flag: str | None  # None for a positional field
    kind: str  # cli_args' shape: bool | list | dict | choice | scalar
    detail: Any  # the choices, or the scalar type
    required: bool
    shown: str  # how the usage line shows its value
    description: str

    def takes_rest(self) -> bool:
        return self.kind == "list" or (self.kind == "scalar" and self.detail is str)

    def value(self, word: str, usage: str) -> Any:
        if self.kind == "dict":
            try:
                return loads(word)  # the CLI's rules for JSON text
            except ValueError as exc:
                raise ChatUsageError(f"{self.field} is not valid JSON: {exc}; usage: {usage}") from None
        if self.kind == "scalar" and self.detail in (int, float):
            try:
                return self.detail(word)
            except ValueError:
                return word  # the registry says what a number looks like
        return word


@dataclass(frozen=True)
class Grammar:
    """One subcommand: its words, positional fields in model order, options by flag."""

    command: str
    words: tuple[str, ...]
    positional: tuple[Slot, ...]
    options: dict[str, Slot]
    from_caller: tuple[str, ...]
    help: str

    def usage(self) -> str:
        parts = ["/memory", *self.words]
        parts += [s.shown if s.required else f"[{s.shown}]" for s in self.positional]
        for flag, s in self.options.items():
            text = flag if s.kind == "bool" else f"{flag} {s.shown}"
            parts.append(text if s.required else f"[{text}]" + ("..." if s.kind == "list" else ""))
        return " ".join(parts)

    def bind(self, words: list[str]) -> dict[str, Any]:
        """The params that ``words`` (after the subcommand) give, caller context aside."""
        usage = self.usage()
        params: dict[str, Any] = {}
        given: list[str] = []
        i, options_done = 0, False
        while i < len(words):
            word = words[i]
            i += 1
            if not options_done and word == "--":
                options_done = True
                continue
            if options_done or not word.startswith("--"):
                given.append(word)
                continue
            flag, eq, value = word.partition("=")
            slot = self.options.get(flag)
            if slot is None:
                takes = ", ".join(self.options) or "no options"
                raise ChatUsageError(f"unknown option {flag} (takes {takes}); usage: {usage}")
            if slot.kind == "bool":
                if eq:
                    raise ChatUsageError(f"{flag} takes no value; usage: {usage}")
                params[slot.field] = True
                continue
            if not eq:
                if i >= len(words):
                    raise ChatUsageError(f"{flag} needs {slot.shown}; usage: {usage}")
                value, i = words[i], i + 1
            if slot.kind == "list":
                params.setdefault(slot.field, []).append(slot.value(value, usage))
            elif slot.field in params:
                raise ChatUsageError(f"{flag} is given twice; usage: {usage}")
            else:
                params[slot.field] = slot.value(value, usage)
        params.update(self._positional(given, usage))
        return params

    def _positional(self, given: list[str], usage: str) -> dict[str, Any]:
        slots = self.positional
        if len(given) > len(slots) and not (slots and slots[-1].takes_rest()):
            extra = " ".join(given[len(slots):])
            raise ChatUsageError(f"unexpected {extra!r}; usage: {usage}")
        params: dict[str, Any] = {}
        missing = []
        for k, slot in enumerate(slots):
            if k >= len(given):
                if slot.required:
                    missing.append(slot.shown)
                continue
            last = k == len(slots) - 1
            if slot.kind == "list":
                params[slot.field] = [slot.value(w, usage) for w in (given[k:] if last else given[k:k + 1])]
            elif last and slot.takes_rest():
                params[slot.field] = " ".join(given[k:])  # the rest of the line
            else:
                params[slot.field] = slot.value(given[k], usage)
        if missing:
            raise ChatUsageError(f"missing {' and '.join(missing)}; usage: {usage}")
        return params


def _slot(name: str, field: FieldInfo) -> Slot:
    cli = cli_of(field)
    kind, detail = shape(field.annotation)
    flag = None if cli.positional else option_flag(name, field)
    if kind == "choice":
        shown = "|".join(str(c) for c in detail)
    elif cli.positional:
        shown = (cli.metavar or name).upper()
    else:
        shown = cli.metavar or name.upper()
    return Slot(name, flag, kind, detail, field.is_required(), shown, field.description or "")


def grammar(cmd: Command) -> Grammar:
    """The chat form of a ``memory.*`` command, from its parameter model."""
    caller = cmd.from_caller
    positional: list[Slot] = []
    options: dict[str, Slot] = {}
    for name, field in cmd.params.model_fields.items():
        # A field read from the environment is not offered: a chat line must not make the
        # node read its own environment variables.
        if name in caller or cli_of(field).env:
            continue
        slot = _slot(name, field)
        if slot.flag is None:
            positional.append(slot)
        else:
            options[slot.flag] = slot
    words = cmd.name.split(".")
    if words[0] == GROUP:  # /memory new, not /memory memory new
        words = words[1:]
    return Grammar(cmd.name, tuple(words), tuple(positional), options, caller, cmd.help)


def grammars(registry: Registry | None = None) -> list[Grammar]:
    """Every subcommand (each command chat callers may run), in the registry's order."""
    return [grammar(cmd) for cmd in _registry(registry) if cmd.chat]


def _words(line: str) -> list[str]:
    try:
        # No comments: '#' is ordinary text (a ticket carries '#secret=').
        return shlex.split(line, comments=False, posix=True)
    except ValueError as exc:
        raise ChatUsageError(f"unbalanced quote ({str(exc).lower()}): close it, or escape a lone quote "
                             "as \\' or \\\"") from None


def _after_prefix(words: list[str], line: str) -> list[str]:
    for prefix in PREFIXES:
        if tuple(words[:len(prefix)]) == prefix:
            return words[len(prefix):]
    shown = line.strip()
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    raise ChatUsageError(f"a memory command starts with /memory or !memmesh memory (got {shown!r}); "
                         "/memory help lists the subcommands")


def _find(words: list[str], registry: Registry | None) -> Grammar:
    matches = [g for g in grammars(registry) if tuple(words[:len(g.words)]) == g.words]
    if not matches:
        subs = ", ".join(" ".join(g.words) for g in grammars(registry))
        raise ChatUsageError(f"unknown /memory subcommand {' '.join(words[:1])!r}; subcommands: {subs}")
    return max(matches, key=lambda g: len(g.words))


def parse(line: str, *, agent: str, session: str | None = None,
          registry: Registry | None = None) -> tuple[str | None, dict[str, Any]]:
    """The registry command and JSON-compatible params that ``line`` asks for, for the caller
    ``agent`` in ``session``. A help request (``/memory``, ``/memory help [SUB]``) gives
    ``(None, {"topic": SUB or None})``: see :func:`help_text`. A line that does not fit the
    form raises ChatUsageError."""
    words = _after_prefix(_words(line), line)
    if not words or words[0] == HELP:
        topic = words[1:]
        if topic:
            _find(topic, registry)  # an unknown topic is a usage error too
        return None, {"topic": " ".join(topic) or None}
    g = _find(words, registry)
    params = g.bind(words[len(g.words):])
    context = {"agent": agent, "session": session}
    for name in g.from_caller:
        if context.get(name) is not None:  # not given: the model's default applies
            params[name] = context[name]
    return g.command, params


def check(command: str, params: dict[str, Any], registry: Registry | None = None) -> Params:
    """The registry's validation of ``params``, its error worded for the chat form and followed
    by the usage line; the parsed parameters, which the command then runs with (judged once)."""
    cmd = _registry(registry).get(command)
    g = grammar(cmd)
    try:
        return validate(cmd.params, params, " ".join(["/memory", *g.words]))
    except ParamsError as exc:
        raise ChatUsageError(f"{exc}; usage: {g.usage()}") from None


def usage(command: str, registry: Registry | None = None) -> str:
    """``/memory grant BANK WHO read|write`` for ``memory.grant``."""
    return grammar(_registry(registry).get(command)).usage()


def help_text(topic: str | None = None, registry: Registry | None = None) -> tuple[dict[str, Any], str]:
    """(data, text) of ``/memory help [TOPIC]``: every subcommand, or one in detail."""
    if topic is None:
        subs = grammars(registry)
        listed = [{"name": " ".join(g.words), "command": g.command, "usage": g.usage(), "help": g.help} for g in subs]
        data: dict[str, Any] = {"subcommands": listed}
        lines = ["/memory subcommands (also !memmesh memory ...):"]
        lines += [f"  {g.usage()}\n      {g.help}" for g in subs]
        lines.append("/memory help SUBCOMMAND describes one")
        return data, "\n".join(lines)
    g = _find(topic.split(), registry)
    slots = [*g.positional, *g.options.values()]
    data = {"name": " ".join(g.words), "command": g.command, "usage": g.usage(), "help": g.help,
            "from_caller": list(g.from_caller)}
    lines = [f"usage: {g.usage()}", g.help]
    lines += [f"  {s.flag or s.shown}: {s.description}" for s in slots]
    if g.from_caller:
        lines.append(f"  ({', '.join(g.from_caller)}: the caller's)")
    return data, "\n".join(lines)


__all__ = ["ChatUsageError", "Grammar", "Slot", "check", "grammar", "grammars", "help_text", "parse",
           "usage"]
