"""What the answer models share: exact objects, fields that are only sometimes present, open maps.

An answer model describes the ``data`` a command returns (what ``--json`` prints, the HTTP
answer's ``data``, an MCP tool's ``structuredContent``). It validates what the handler built,
never what a caller sent, so it only describes: no coercion is relied on (the check validates
the JSON form, strictly: node/commands/answers/__init__.py).
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Answer(BaseModel):
    """An object whose keys are all known: a key the model does not name is an answer that
    changed without its schema, and the check says so.

    Built when first used (``defer_build``): a process checks or publishes the answers of a few
    commands, and building every model at import would cost it more than running them."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, defer_build=True)


class OpenAnswer(BaseModel):
    """An object with these keys and possibly more (a structure owned by a lower layer that may
    grow, such as a sync exchange's statistics). Built when first used, as :class:`Answer`."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, defer_build=True)


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def omitted(description: str | None = None, alias: str | None = None) -> Any:
    """A key the handler sets only when it applies (never as null): optional in the schema,
    with its type unchanged."""
    return Field(default=None, description=description, alias=alias, json_schema_extra=_no_default)


def open_object(description: str) -> Any:
    """A field whose value is a JSON object of no fixed shape (a config dump, a peer's record)."""
    return Field(description=description)
