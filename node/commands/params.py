"""Parameter models: the one schema of each command, and the one wording of their errors.

A command's parameters are a pydantic model (subclass :class:`Params`). That declaration gives
validation of JSON-compatible input, typed access in the handler, and the JSON Schema that the
HTTP API, OpenAPI and MCP tool schemas are generated from. How a field is typed on the
command line is presentation, not schema: it is attached to the field as a :class:`Cli`
marker (``Annotated[str, Cli(positional=True)]``), which pydantic keeps and ignores.
"""
from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import ConfigDict, Field, SecretStr, ValidationError, model_validator

from memmesh.node.commands.json_input import (  # noqa: F401  (where the API and the CLI import them from)
    MAX_DEPTH,
    json_nesting,
    loads,
    no_json_constant,
    unique_keys,
)
from memmesh.node.history.record import MAX_SESSION_CHARS
from memmesh.node.memory.rows import MAX_SLUG_CHARS
from memmesh.node.refusal import ParamsError
from memmesh.node.settings import NAME_PATTERN
from memmesh.node.strict import StrictModel
from memmesh.node.validation_text import json_type, shown, what_is_wrong, worded

# Parameters that name something the node looks up (an agent, a bank, a database, a key): a
# control character in one is never a real name, and NUL reaches storage's own checks as a bug.
NAME_FIELDS = frozenset({"agent", "agents", "bank", "banks", "ref", "db", "who", "name"})


def control_character(text: str) -> str | None:
    """The first control character of ``text`` (NUL, ESC, a line break, DEL, ...), or None."""
    return next((c for c in text if unicodedata.category(c) == "Cc"), None)


class Params(StrictModel):
    """Base of every command's parameters (strict types, unknown fields refused, null = the
    default: node/strict.py), so every transport accepts exactly what the schema says. A name
    (``NAME_FIELDS``) with a control character is refused here, once for every command and
    transport (CLI, HTTP, MCP tools, chat lines), before any lookup."""

    # A model's validator and schema are built when first used, not when its module is
    # imported: a process runs one command of the ~65 its handler modules declare, and building
    # them all cost about a quarter of a command's start. What they validate is the same.
    model_config = ConfigDict(defer_build=True)

    @model_validator(mode="before")
    @classmethod
    def _printable_names(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name in sorted(NAME_FIELDS & data.keys()):
            value = data[name]
            for item in value if isinstance(value, list) else [value]:
                bad = control_character(item) if isinstance(item, str) else None
                if bad is not None:
                    raise ValueError(f"{name} must not contain control characters (got {shown(item)}, "
                                     f"which holds {bad!r})")
        return data


@dataclass(frozen=True)
class Cli:
    """How a field appears on the command line (the CLI parser is derived from the models).

    Not positional: an option ``--field-name`` (or ``flag``); booleans are switches, lists are
    repeatable options, ``dict`` fields are JSON text. ``env``: the option names an environment
    variable whose value is the parameter, so a secret never stands on the command line.
    ``path``: the value is a file path, made absolute against the caller's working directory,
    so a command sent to a running serve reads the file the caller meant. ``read``: the value
    is a file the CLI process reads itself; the parameter is its text, and the file's absolute
    path goes into the parameter ``read`` names (for messages only). serve then never opens a
    path a request gives: the caller reads what the caller may read.
    """

    positional: bool = False
    flag: str | None = None
    metavar: str | None = None
    env: bool = False
    path: bool = False
    read: str | None = None


# ------------------------------------------------------------------ the shared string types
# Each constraint a handler or storage applies to a string is declared here, in the type, so the
# published JSON Schema (HTTP, OpenAPI, MCP) and the validation are the same object: a request
# the schema allows is not refused as malformed, and one it forbids is refused (400
# invalid_params) before any lookup. Patterns read the same in JSON Schema (ECMA-262) and in
# pydantic's Rust regex: anchored with ^ and $ (which end the text in both), no lookaround.
_NAME_BODY = NAME_PATTERN.removeprefix("^").removesuffix("$")
ENTRY_ID_PATTERN = worded("^sha256:[0-9a-f]{64}$", "must be an entry id (sha256: and 64 lowercase hex digits)")
REF_PATTERN = worded(f"^(?:{_NAME_BODY}|sha256:[0-9a-f]{{64}})$",
                     "should be a name (1-64 ASCII letters, digits, '.', '_' or '-', starting with a letter or "
                     "digit) or a database id (sha256: and 64 lowercase hex digits)")
# Not blank: at least one character that is not white space as str.isspace() counts it (the
# rule of node/memory/rows.py), spelt out so that every regex engine reads the same class.
_SPACES = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
NOT_BLANK_PATTERN = worded(f"[^{_SPACES}]", "must not be blank (only white space)")
# An ISO 8601 date, or date and time (seconds, fraction and UTC offset optional): only days that
# exist (29 February in leap years), so every value the pattern allows is a time. Years 1000-2999.
_YEAR = "[12][0-9]{3}"
_LEAP = "(?:[12][0-9](?:0[48]|[2468][048]|[13579][26])|(?:1[26]|2[048])00)"
_MONTH_DAY = ("(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
              "|02-(?:0[1-9]|1[0-9]|2[0-8]))")
_CLOCK = "(?:[01][0-9]|2[0-3]):[0-5][0-9](?::[0-5][0-9](?:\\.[0-9]{1,6})?)?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])?"
TIME_PATTERN = worded(f"^(?:{_YEAR}-{_MONTH_DAY}|{_LEAP}-02-29)(?:[T ]{_CLOCK})?$",
                      "must be an ISO 8601 date or time such as 2026-06-01 or 2026-06-01T09:00:00Z "
                      "(years 1000-2999)")


def not_blank(max_chars: int) -> Any:
    """The constraint of a text that must hold something: 1-``max_chars`` characters, not all white space."""
    return Field(min_length=1, max_length=max_chars, pattern=NOT_BLANK_PATTERN)


Name = Annotated[str, Field(pattern=NAME_PATTERN)]  # an agent's or a bank's name
AgentName = Annotated[str, Cli(positional=True), Field(pattern=NAME_PATTERN, description="the agent's name")]
OptionalAgent = Annotated[str | None, Field(pattern=NAME_PATTERN)]
Ref = Annotated[str, Field(pattern=REF_PATTERN)]  # a bank name, an agent name or a database id
BankRef = Annotated[str, Cli(positional=True), Field(
    pattern=REF_PATTERN, description="a bank name, an agent name (its own database) or a database id")]
OptionalBank = Annotated[str | None, Field(pattern=REF_PATTERN, description=(
    "a bank name, an agent name or a database id; default: the agent's own database"))]
EntryId = Annotated[str, Field(pattern=ENTRY_ID_PATTERN)]
Time = Annotated[str, Field(pattern=TIME_PATTERN)]
SLUG_PATTERN = worded(f"^[a-z0-9][a-z0-9_.-]{{0,{MAX_SLUG_CHARS - 1}}}$",
                      f"must be a lowercase slug of 1-{MAX_SLUG_CHARS} characters (a-z, 0-9, _ . -, "
                      "starting with a letter or digit)")
Slug = Annotated[str, Field(pattern=SLUG_PATTERN)]  # a category, a link's type, an episode's kind
# A public key as node/auth spells it: ed25519: and 43 base64url characters, the last of which
# carries only two bits (a canonical spelling has the unused bits zero).
KEY_PATTERN = worded("^ed25519:[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]$",
                     "must be a public key (ed25519: and 43 base64url characters)")
PublicKeyText = Annotated[str, Field(pattern=KEY_PATTERN)]
# Who holds or wrote something: a key, a label as memory grants shows it (node:self, peer:...,
# agent:NAME, key:...) or a local agent's name.
WHO_PATTERN = worded(f"^(?:{KEY_PATTERN[1:-1]}|[a-z]+:[^\x00-\x1f\x7f-\x9f]{{1,200}}|{_NAME_BODY})$",
                     "must be a key (ed25519: and 43 base64url characters), a label such as node:self or "
                     "agent:NAME, or an agent's name")
Who = Annotated[str, Field(pattern=WHO_PATTERN)]
Session = Annotated[str, not_blank(MAX_SESSION_CHARS), Field(description=(
    f"the conversation's session name (1-{MAX_SESSION_CHARS} characters)"))]


class AgentParams(Params):
    """Parameters of a command that acts for one agent."""

    agent: AgentName


class NoParams(Params):
    """A command that takes nothing."""


def parse(model: type[Params], params: Any, what: str) -> Params:
    """Validate JSON-compatible ``params`` against ``model``; ``what`` names it in errors."""
    if not isinstance(params, dict):
        raise ParamsError(f"{what} takes a JSON object of parameters, got {json_type(params)}")
    _check_text(params, what)
    try:
        # Through JSON text, as a socket would carry it: in-process and remote calls are then
        # validated identically, and a value that is not JSON data is refused here.
        text = json.dumps(params)
    except (TypeError, ValueError) as exc:
        raise ParamsError(f"{what}: parameters must be JSON data ({exc})") from None
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        raise ParamsError(describe(what, model, exc)) from None


def _check_text(params: dict[str, Any], what: str) -> None:
    """Refuse, in one line, what no transport may hand a command: nesting deeper than
    MAX_DEPTH, and a lone surrogate (U+D800-U+DFFF) in a string or a key. A surrogate is not
    Unicode text: JSON can spell it (``"\\ud800"``), a command line can carry it (bytes that are
    not UTF-8), but no file, database or peer can store it. Iterative, so no depth recurses."""
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(params, 1, ())]
    while stack:
        value, depth, loc = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise ParamsError(f"{what}: the parameters nest arrays and objects more than {MAX_DEPTH} deep")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str):
                    _no_surrogate(key, what, loc, "a key")
                stack.append((item, depth + 1, (*loc, key)))
        elif isinstance(value, str):
            _no_surrogate(value, what, loc, _loc(loc) or "a value")


def _no_surrogate(text: str, what: str, loc: tuple[Any, ...], where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        shown = f" of {_loc(loc)}" if where == "a key" and loc else ""
        raise ParamsError(f"{what}: {where}{shown} holds {text[exc.start]!r}, a lone surrogate, which is not "
                          "text; send UTF-8 text") from None


def describe(what: str, model: type[Params], exc: ValidationError) -> str:
    """One line for people, the same from every transport: what is missing, unknown, wrong."""
    missing = [_loc(e["loc"]) for e in exc.errors() if e["type"] == "missing"]
    unknown = [_loc(e["loc"]) for e in exc.errors() if e["type"] == "extra_forbidden"]
    parts = []
    if missing:
        parts.append(f"{what} needs {' and '.join(missing)}")
    if unknown:
        takes = ", ".join(sorted(f.alias or n for n, f in model.model_fields.items())) or "nothing"
        parts.append(f"{what} does not take {', '.join(sorted(unknown))}; it takes {takes}")
    for e in exc.errors():
        if e["type"] in ("missing", "extra_forbidden"):
            continue
        message = what_is_wrong(e)
        where = _loc(e["loc"])
        text = f"{where} {message}" if where else message
        if where and not _is_secret(model, e["loc"]):
            text += f" (got {shown(e['input'])})"
        parts.append(text if parts else f"{what}: {text}")
    return "; ".join(parts)


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _is_secret(model: type[Params], loc: tuple[Any, ...]) -> bool:
    field = model.model_fields.get(loc[0]) if loc else None
    return field is not None and field.annotation in (SecretStr, SecretStr | None)


__all__ = ["AgentName", "AgentParams", "BankRef", "Cli", "EntryId", "Name", "NoParams", "OptionalAgent", "OptionalBank",
           "Params", "ParamsError", "PublicKeyText", "Ref", "Session", "Slug", "Time", "Who", "control_character", "describe", "not_blank", "parse"]
