"""How a refused value is worded: the one wording of pydantic's errors, for command parameters
(node/commands/params.py) and config.yaml (node/settings.py) alike.

Each reader places the words in its own frame (a command's name; a file and line), but what is
wrong and how the value is quoted are said here once. Only the standard library.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_SHOWN = 40  # a quoted value is cut to this many characters: enough to recognise it

# What a published pattern means, for people (a regular expression in an error message helps
# nobody): filled by the modules that declare patterns, through :func:`worded`.
PATTERN_WORDS: dict[str, str] = {}


def worded(pattern: str, words: str) -> str:
    """``pattern``, recorded with the words an error says when a value does not match it
    ("should be ..." or "must be ...", after the field's name)."""
    if PATTERN_WORDS.get(pattern, words) != words:
        raise ValueError(f"the pattern {pattern!r} is worded twice")
    PATTERN_WORDS[pattern] = words
    return pattern


def what_is_wrong(error: Mapping[str, Any]) -> str:
    """One pydantic error's message for people: a pattern's words (:func:`worded`), a
    validator's own words without pydantic's "Value error, " prefix, and "should ..." rather
    than "Input should ..." or "String should ..."."""
    if error.get("type") == "string_pattern_mismatch":
        words = PATTERN_WORDS.get(str(error.get("ctx", {}).get("pattern")))
        if words is not None:
            return words
    message = str(error["msg"]).removeprefix("Value error, ")
    # After the field's name: "key should have at least 1 character", not "key String should ...".
    subject, _, rest = message.partition(" ")
    return rest if subject in ("Input", "String", "List", "Value") and rest.startswith("should") else message


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
