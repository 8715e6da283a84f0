"""How a parameter model's field is typed in words: the one reading the CLI's description
(node/commands/describe.py) and the chat grammar (node/chat.py) share.

A field is positional when marked ``Cli(positional=True)``, else an option named ``--field-name``
(or its ``Cli(flag=...)``); its kind is bool (a switch), list (repeatable; of JSON objects for
a list of objects), dict (JSON text), choice (a ``Literal``) or scalar (int, float or text).
"""
from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from memmesh.node.commands.params import Cli


def cli_of(field: FieldInfo) -> Cli:
    """The field's command-line marker (the default one when it has none)."""
    return next((m for m in field.metadata if isinstance(m, Cli)), Cli())


def option_flag(name: str, field: FieldInfo) -> str:
    """The option that sets a non-positional field (the chat grammar names options the same way)."""
    return cli_of(field).flag or "--" + name.replace("_", "-")


def shape(annotation: Any) -> tuple[str, Any]:
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


def max_length(field: FieldInfo) -> int | None:
    """The field's own bound on its length, if it has one."""
    return next((m.max_length for m in field.metadata if getattr(m, "max_length", None) is not None), None)
