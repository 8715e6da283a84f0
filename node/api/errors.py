"""The API's errors: one table from exception class to HTTP status and stable code.

Every error answer is ``{"error": {"code": "<code>", "message": "<one line>"}}``. The message
of a refused command is the line the CLI prints for it (node.cli.failure); the code is what a
program branches on, and never changes meaning.
"""
from __future__ import annotations

from dataclasses import dataclass

from memmesh.auth.errors import AuthError, MemmeshError
from memmesh.node.commands.audit import UnknownEntry
from memmesh.node.commands.params import ParamsError
from memmesh.node.commands.registry import UnknownCommand
from memmesh.node.registry import NameTaken, UnknownName
from memmesh.node.settings import ToolNotAllowed


@dataclass(frozen=True)
class Kind:
    status: int
    code: str
    description: str


INVALID_JSON = Kind(400, "invalid_json", "the body is not JSON, or not a JSON object")
INVALID_PARAMS = Kind(400, "invalid_params", "the parameters do not fit the command's schema; nothing was changed")
UNAUTHORIZED = Kind(401, "unauthorized", "no bearer token, or not this node's")
FORBIDDEN = Kind(403, "forbidden", "the database's settings do not allow it")
TOOL_NOT_ALLOWED = Kind(403, "tool_not_allowed", "the agent's allowed_tools in config.yaml exclude the tool")
NOT_FOUND = Kind(404, "not_found", "no such route, agent, bank or entry")
METHOD_NOT_ALLOWED = Kind(405, "method_not_allowed", "the route exists with another method")
MISDIRECTED = Kind(421, "misdirected_request",
                   "the Host header does not name the address the API listens on (a DNS-rebinding guard)")
CONFLICT = Kind(409, "conflict", "the name is taken")
BODY_TOO_LARGE = Kind(413, "body_too_large", "the body is over the limit")
UNSUPPORTED_MEDIA_TYPE = Kind(415, "unsupported_media_type", "the body is not application/json")
REFUSED = Kind(422, "refused", "the node refused the command; the message says why; nothing was changed")
INTERNAL = Kind(500, "internal", "a bug: serve's log has the details")

KINDS = (INVALID_JSON, INVALID_PARAMS, UNAUTHORIZED, FORBIDDEN, TOOL_NOT_ALLOWED, NOT_FOUND, METHOD_NOT_ALLOWED,
         MISDIRECTED, CONFLICT, BODY_TOO_LARGE, UNSUPPORTED_MEDIA_TYPE, REFUSED, INTERNAL)
CODES = tuple(k.code for k in KINDS)

# What a command's exception means for HTTP; the most specific class in the exception's MRO wins.
BY_CLASS: dict[type[BaseException], Kind] = {
    ParamsError: INVALID_PARAMS,
    AuthError: FORBIDDEN,
    ToolNotAllowed: TOOL_NOT_ALLOWED,
    UnknownName: NOT_FOUND,
    UnknownEntry: NOT_FOUND,
    UnknownCommand: NOT_FOUND,
    NameTaken: CONFLICT,
    MemmeshError: REFUSED,
    # The file system refused (a file a parameter names): a refusal for the CLI too (node.cli.failure).
    OSError: REFUSED,
}


def kind_of(exc: BaseException) -> Kind:
    """The status and code of a command's exception; INTERNAL for anything not a refusal."""
    for cls in type(exc).__mro__:
        kind = BY_CLASS.get(cls)
        if kind is not None:
            return kind
    return INTERNAL


class HttpError(Exception):
    """An error the transport itself finds (no token, bad JSON, too large, ...)."""

    def __init__(self, kind: Kind, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.headers = headers or {}


def envelope(code: str, message: str) -> dict[str, dict[str, str]]:
    return {"error": {"code": code, "message": message}}
