"""JSON text that people or programs give a parameter as, read by one set of rules.

The HTTP API's body, the CLI's and chat's JSON options and the control channel's parameters
are all bounded the same way: nesting at most MAX_DEPTH, no NaN or Infinity, no key twice.
Only the standard library: the CLI reads a JSON option before anything heavy is imported.
"""
from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

from memmesh.node.validation_text import shown

# No command takes parameters nested more than a few levels (edges, a config value's mapping);
# the HTTP API refuses deeper bodies before decoding them, and this holds for every other
# transport (MCP, chat, the control channel) before json.dumps would recurse into them.
MAX_DEPTH = 64


def json_nesting(raw: bytes) -> int:
    """How deep the arrays and objects of JSON text nest, at most (brackets in strings do not
    count), found without decoding it: text nested 100,000 deep must be refused before
    json.loads recurses into it. Malformed text gives some number; json.loads then says what is
    wrong."""
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(_BRACKETS[b] for b in brackets), default=0)


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)


def no_json_constant(name: str) -> Any:
    """json.loads' parse_constant: NaN and Infinity are not JSON numbers."""
    raise ValueError(f"{name} is not a JSON number")


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads' object_pairs_hook: an object naming a key twice is refused, since which of
    the two a reader takes differs between JSON parsers (what a client or a proxy checked need
    not be what runs)."""
    value: dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            raise ValueError(f"the key {shown(key)} appears twice in one object")
        value[key] = item
    return value


def loads(text: str) -> Any:
    """JSON text that people or programs give a parameter as (the CLI's and chat's JSON
    options), read by the HTTP API's rules: nesting at most MAX_DEPTH, no NaN or Infinity, no
    key twice. ValueError says what is wrong."""
    if json_nesting(text.encode("utf-8", "surrogatepass")) > MAX_DEPTH:
        raise ValueError(f"it nests arrays and objects more than {MAX_DEPTH} deep")
    try:
        return json.loads(text, parse_constant=no_json_constant, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{exc.msg} at position {exc.pos}") from None

