"""Permissions and the rules for changing them (pure: no I/O, no asyncio).

A key holds at most one permission: ``Admin(priority)``, ``Write(priority)`` or ``Read``.
Levels are ordered admin > write > read; within admin and within write a LOWER priority number
is MORE power. Admin holds Write, Write holds Read.

``may_change`` is the one rule for every settings operation (grant, change, revoke): the actor
must be an admin, the target's current permission must not carry a stronger priority than the
actor's, and a grant never gives more than the actor holds. The valid-set algorithm that applies
these rules to a DAG of entries lives in ``crdt.validity``; ``AuthSettings`` is the read-only
snapshot it derives.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

ADMIN = "admin"
WRITE = "write"
READ_LEVEL = "read"
LEVELS = (ADMIN, WRITE, READ_LEVEL)  # strongest first
MAX_PRIORITY = 2**31 - 1

ACTIVE = "active"
REVOKED = "revoked"

# Reason codes returned by may_change.
NOT_ADMIN = "auth.not_admin"
TARGET_STRONGER = "auth.target_stronger"
GRANT_EXCEEDS = "auth.grant_exceeds"

_LEVEL_INDEX = {level: i for i, level in enumerate(LEVELS)}


def _check_priority(priority: object) -> int:
    if type(priority) is not int or not 0 <= priority <= MAX_PRIORITY:
        raise ValueError(f"a priority is an int in 0..{MAX_PRIORITY}, got {priority!r}")
    return priority


@dataclass(frozen=True, slots=True)
class Permission:
    """``level`` is "admin", "write" or "read"; ``priority`` is set for admin/write only."""

    level: str
    priority: int | None = None

    def __post_init__(self) -> None:
        if self.level not in _LEVEL_INDEX:
            raise ValueError(f"unknown permission level {self.level!r}")
        if self.level == READ_LEVEL:
            if self.priority is not None:
                raise ValueError("Read has no priority")
        else:
            _check_priority(self.priority)

    @property
    def rank(self) -> tuple[int, int]:
        """Sort key: smaller is stronger (level first, then priority)."""
        return (_LEVEL_INDEX[self.level], self.priority or 0)

    def __str__(self) -> str:
        if self.priority is None:
            return self.level.capitalize()
        return f"{self.level.capitalize()}({self.priority})"


def Admin(priority: int) -> Permission:  # noqa: N802 - reads like the design's notation
    return Permission(ADMIN, priority)


def Write(priority: int) -> Permission:  # noqa: N802
    return Permission(WRITE, priority)


READ = Permission(READ_LEVEL)

_NO_PERMISSION_RANK = (len(LEVELS), 0)


def rank(p: Permission | None) -> tuple[int, int]:
    """Sort key over permissions and "nothing": smaller is stronger, None is weakest."""
    return _NO_PERMISSION_RANK if p is None else p.rank


def stronger(a: Permission | None, b: Permission | None) -> bool:
    """True iff ``a`` is strictly stronger than ``b`` in the total order (level, then priority)."""
    return rank(a) < rank(b)


def weakest(perms: Iterable[Permission]) -> Permission:
    """The weakest of several permissions (used when concurrent grants disagree)."""
    return max(perms, key=rank)


def holds(p: Permission | None, needed: str) -> bool:
    """Does permission ``p`` include level ``needed`` ("admin", "write" or "read")?"""
    if needed not in _LEVEL_INDEX:
        raise ValueError(f"unknown permission level {needed!r}")
    return p is not None and _LEVEL_INDEX[p.level] <= _LEVEL_INDEX[needed]


def may_change(
    actor: Permission | None, target_current: Permission | None, new: Permission | None
) -> str | None:
    """May a key holding ``actor`` set a key holding ``target_current`` to ``new``?

    ``new`` None means revoke; ``target_current`` None means the target holds nothing (unknown
    or revoked). Returns None when allowed, else the reason code:

    - "auth.not_admin": the actor is not an admin;
    - "auth.target_stronger": the target holds Admin or Write with a priority number LOWER than
      the actor's (same priority is allowed; Read carries no priority and is never stronger);
    - "auth.grant_exceeds": the grant gives Admin or Write with a priority number lower than the
      actor's (an admin never gives more than it holds).
    """
    if actor is None or actor.level != ADMIN:
        return NOT_ADMIN
    assert actor.priority is not None
    if (target_current is not None and target_current.priority is not None
            and target_current.priority < actor.priority):
        return TARGET_STRONGER
    if new is not None and new.priority is not None and new.priority < actor.priority:
        return GRANT_EXCEEDS
    return None


@dataclass(frozen=True, slots=True)
class KeyState:
    """What the settings say about one key.

    ``permission`` is None when ``status`` is "revoked" (a revoked key holds nothing).
    ``granted_by`` lists the entry ids of the operations that decided this state: the causally
    latest grants that gave ``permission``, or the revocations that revoked the key.
    """

    permission: Permission | None
    status: str
    granted_by: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.status == ACTIVE:
            if self.permission is None:
                raise ValueError("an active key holds a permission")
        elif self.status == REVOKED:
            if self.permission is not None:
                raise ValueError("a revoked key holds no permission")
        else:
            raise ValueError(f"unknown key status {self.status!r}")

    @property
    def active(self) -> bool:
        return self.status == ACTIVE


class AuthSettings:
    """A read-only snapshot: public key string -> KeyState.

    Derived from the accepted settings operations (see ``crdt.validity``); never edited in place.
    """

    __slots__ = ("_states",)

    def __init__(self, states: Mapping[str, KeyState] | None = None) -> None:
        self._states: dict[str, KeyState] = dict(states or {})

    def get(self, key: str) -> KeyState | None:
        return self._states.get(key)

    def permission(self, key: str) -> Permission | None:
        """The permission ``key`` holds now (None if unknown or revoked)."""
        state = self._states.get(key)
        return state.permission if state is not None else None

    def holds(self, key: str, needed: str) -> bool:
        return holds(self.permission(key), needed)

    def items(self) -> list[tuple[str, KeyState]]:
        """Every key the settings mention (revoked ones included), sorted by key."""
        return sorted(self._states.items())

    def keys(self) -> list[str]:
        return sorted(self._states)

    def admins(self) -> list[tuple[str, Permission]]:
        """Active admins, strongest first (priority, then key)."""
        out = [(k, s.permission) for k, s in self._states.items()
               if s.permission is not None and s.permission.level == ADMIN]
        out.sort(key=lambda kp: (kp[1].rank, kp[0]))
        return out

    def __contains__(self, key: object) -> bool:
        return key in self._states

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._states)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AuthSettings):
            return NotImplemented
        return self._states == other._states

    # Unhashable, as before: a class that defines __eq__ without __hash__ gets __hash__ = None.

    def __repr__(self) -> str:
        inner = ", ".join(
            f"{k}: {s.permission if s.active else 'revoked'}" for k, s in self.items()
        )
        return f"AuthSettings({{{inner}}})"
