"""How a refused value is worded: the one wording of pydantic's errors, for command parameters
(node/commands/params.py) and config.yaml (node/settings.py) alike.

Each reader places the words in its own frame (a command's name; a file and line), but what is
wrong and how the value is quoted are said here once. Only the standard library.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_SHOWN = 40  # a quoted value is cut to this many characters: enough to recognise it


def what_is_wrong(error: Mapping[str, Any]) -> str:
    """One pydantic error's message for people: a validator's own words without pydantic's
    "Value error, " prefix, and "should ..." rather than "Input should ..."."""
    message = str(error["msg"]).removeprefix("Value error, ")
    return message.removeprefix("Input ") if message.startswith("Input should") else message


def shown(value: Any, mapping: str = "an object", sequence: str = "an array") -> str:
    """A value as an error line quotes it: its repr, cut; a mapping or a list by its kind (in
    the words of the text it came from: JSON's by default)."""
    if isinstance(value, dict):
        return mapping
    if isinstance(value, list):
        return sequence
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN - 3] + "..."


def json_type(value: Any) -> str:
    """What kind of JSON value ``value`` is, as a message names it."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)
