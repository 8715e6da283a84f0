"""Settings operations: the rows of a database's ``_settings`` store.

Every store is append-only, so AuthSettings is never edited: it is derived (``crdt.validity``)
from these operations, carried by signed entries. The two row shapes, exactly:

    {"op": "grant", "key": K, "perm": "admin" | "write", "priority": P}   0 <= P <= 2**31 - 1
    {"op": "grant", "key": K, "perm": "read"}                             (no priority)
    {"op": "revoke", "key": K}

K is a canonical public key string ``ed25519:<43 base64url chars>``. A grant to a key that
already holds a permission is a change (promotion or demotion). ``parse_op`` is strict: any
other shape, unknown field, wrong type (``True`` is not an int) or non-canonical key raises
``AuthError(reason="auth.bad_op")``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from memmesh.auth.errors import AuthError, KeyFormatError
from memmesh.auth.keys import PublicKey
from memmesh.auth.permissions import LEVELS, MAX_PRIORITY, READ_LEVEL, Permission

BAD_OP = "auth.bad_op"

_GRANT_FIELDS_RANKED = frozenset({"op", "key", "perm", "priority"})
_GRANT_FIELDS_READ = frozenset({"op", "key", "perm"})
_REVOKE_FIELDS = frozenset({"op", "key"})


def _bad(detail: str) -> AuthError:
    return AuthError(BAD_OP, f"malformed settings operation: {detail}")


def check_key(key: object) -> str:
    """``key`` if it is a canonical ``ed25519:<base64url>`` string, else AuthError(auth.bad_op)."""
    if type(key) is not str:
        raise _bad(f"key must be a string, got {type(key).__name__}")
    try:
        PublicKey.parse(key)
    except KeyFormatError as exc:
        raise _bad(str(exc)) from None
    return key


@lru_cache(maxsize=1024)
def _permission(perm: str, priority: int | None) -> Permission:
    # Permissions are immutable values read on every verdict: build each one once.
    return Permission(perm, priority)


@dataclass(frozen=True, slots=True)
class GrantOp:
    """Give ``key`` the permission ``perm`` (with ``priority`` for admin/write)."""

    key: str
    perm: str
    priority: int | None = None

    def __post_init__(self) -> None:
        check_key(self.key)
        if type(self.perm) is not str or self.perm not in LEVELS:
            raise _bad(f"perm must be one of {', '.join(LEVELS)}, got {self.perm!r}")
        if self.perm == READ_LEVEL:
            if self.priority is not None:
                raise _bad("a read grant carries no priority")
        elif type(self.priority) is not int or not 0 <= self.priority <= MAX_PRIORITY:
            raise _bad(f"an {self.perm} grant needs an int priority in 0..{MAX_PRIORITY}, got {self.priority!r}")

    @property
    def permission(self) -> Permission:
        return _permission(self.perm, self.priority)

    def to_value(self) -> dict[str, Any]:
        """The ``_settings`` row value (inverse of parse_op)."""
        value: dict[str, Any] = {"op": "grant", "key": self.key, "perm": self.perm}
        if self.priority is not None:
            value["priority"] = self.priority
        return value

    def __str__(self) -> str:
        return f"grant {self.permission} to {self.key}"


@dataclass(frozen=True, slots=True)
class RevokeOp:
    """Revoke every permission of ``key``."""

    key: str

    def __post_init__(self) -> None:
        check_key(self.key)

    @property
    def permission(self) -> None:
        return None

    def to_value(self) -> dict[str, Any]:
        return {"op": "revoke", "key": self.key}

    def __str__(self) -> str:
        return f"revoke {self.key}"


SettingsOp = GrantOp | RevokeOp


def parse_op(value: object) -> GrantOp | RevokeOp:
    """Parse one ``_settings`` row value; AuthError(reason="auth.bad_op") if malformed."""
    if not isinstance(value, dict):
        raise _bad(f"expected a map, got {type(value).__name__}")
    if not all(type(k) is str for k in value):
        raise _bad("field names must be strings")
    fields = frozenset(value)
    kind = value.get("op")
    if kind == "revoke" and type(kind) is str:
        if fields != _REVOKE_FIELDS:
            raise _bad(_field_diff(fields, _REVOKE_FIELDS))
        return RevokeOp(check_key(value["key"]))
    if kind == "grant" and type(kind) is str:
        perm = value.get("perm")
        if type(perm) is not str or perm not in LEVELS:
            raise _bad(f"perm must be one of {', '.join(LEVELS)}, got {perm!r}")
        expected = _GRANT_FIELDS_READ if perm == READ_LEVEL else _GRANT_FIELDS_RANKED
        if fields != expected:
            raise _bad(_field_diff(fields, expected))
        return GrantOp(check_key(value["key"]), perm, value.get("priority"))
    raise _bad(f"op must be 'grant' or 'revoke', got {kind!r}")


def _field_diff(fields: frozenset[str], expected: frozenset[str]) -> str:
    parts = []
    if fields - expected:
        parts.append("unknown field(s) " + ", ".join(sorted(fields - expected)))
    if expected - fields:
        parts.append("missing field(s) " + ", ".join(sorted(expected - fields)))
    return "; ".join(parts)


__all__ = ["BAD_OP", "GrantOp", "RevokeOp", "SettingsOp", "check_key", "parse_op"]
