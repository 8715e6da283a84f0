"""Unit tests for auth.permissions (holds, may_change, settings snapshot) and auth.ops (parse_op)."""
from __future__ import annotations

import pytest

from memmesh.auth.errors import AuthError
from memmesh.auth.ops import GrantOp, RevokeOp, parse_op
from memmesh.auth.permissions import (
    READ,
    Admin,
    AuthSettings,
    KeyState,
    Permission,
    Write,
    holds,
    may_change,
    stronger,
    weakest,
)
from tests.dbkit import key_str as key

K = key("k")


# ------------------------------------------------------------------------------- holds


@pytest.mark.parametrize(
    "perm, needed, expected",
    [
        (Admin(0), "admin", True), (Admin(7), "write", True), (Admin(7), "read", True),
        (Write(0), "admin", False), (Write(0), "write", True), (Write(3), "read", True),
        (READ, "admin", False), (READ, "write", False), (READ, "read", True),
        (None, "admin", False), (None, "write", False), (None, "read", False),
    ],
)
def test_holds(perm, needed, expected):
    assert holds(perm, needed) is expected


def test_holds_rejects_unknown_level():
    with pytest.raises(ValueError):
        holds(Admin(0), "owner")


def test_permission_order_level_then_lower_priority():
    assert stronger(Admin(5), Write(0))
    assert stronger(Write(9), READ)
    assert stronger(Admin(1), Admin(2))
    assert not stronger(Admin(2), Admin(2))
    assert stronger(READ, None)
    assert weakest([Admin(0), Write(4), Admin(3)]) == Write(4)
    assert weakest([Admin(0), Admin(3)]) == Admin(3)


@pytest.mark.parametrize("level, priority", [("admin", None), ("write", -1), ("read", 0),
                                             ("owner", 1), ("admin", 2**31), ("write", True)])
def test_invalid_permissions_cannot_be_built(level, priority):
    with pytest.raises(ValueError):
        Permission(level, priority)


# --------------------------------------------------------------------------- may_change


@pytest.mark.parametrize("actor", [None, READ, Write(0)])
def test_may_change_needs_admin(actor):
    assert may_change(actor, None, Write(5)) == "auth.not_admin"
    assert may_change(actor, READ, None) == "auth.not_admin"


def test_may_change_target_stronger():
    assert may_change(Admin(5), Admin(0), None) == "auth.target_stronger"  # revoke
    assert may_change(Admin(5), Admin(0), Write(7)) == "auth.target_stronger"  # demote
    assert may_change(Admin(5), Admin(4), Admin(9)) == "auth.target_stronger"
    # A write key's priority protects it too (docs/security.md: keys whose priority is stronger).
    assert may_change(Admin(5), Write(2), None) == "auth.target_stronger"


def test_may_change_same_priority_or_weaker_target_allowed():
    assert may_change(Admin(1), Admin(1), None) is None  # equal admins may revoke each other
    assert may_change(Admin(1), Admin(3), Write(1)) is None
    assert may_change(Admin(1), Write(1), None) is None
    assert may_change(Admin(9), READ, None) is None  # Read carries no priority
    assert may_change(Admin(9), None, None) is None  # revoking an unknown/revoked key


def test_may_change_grant_exceeds():
    assert may_change(Admin(3), None, Admin(2)) == "auth.grant_exceeds"
    assert may_change(Admin(3), None, Write(2)) == "auth.grant_exceeds"
    assert may_change(Admin(3), READ, Admin(0)) == "auth.grant_exceeds"
    assert may_change(Admin(3), None, Admin(3)) is None
    assert may_change(Admin(3), None, Write(3)) is None
    assert may_change(Admin(3), None, READ) is None


def test_may_change_checks_target_before_grant():
    assert may_change(Admin(5), Admin(0), Admin(0)) == "auth.target_stronger"


# --------------------------------------------------------------------------- snapshot


def test_auth_settings_snapshot():
    a, b, c = key("a"), key("b"), key("c")
    s = AuthSettings({
        b: KeyState(Write(2), "active", ("sha256:1",)),
        a: KeyState(Admin(1), "active", ("sha256:2",)),
        c: KeyState(None, "revoked", ("sha256:3",)),
    })
    assert s.get(a).permission == Admin(1)
    assert s.get(key("nobody")) is None
    assert s.permission(c) is None and s.get(c).status == "revoked"
    assert s.admins() == [(a, Admin(1))]
    assert [k for k, _ in s.items()] == sorted([a, b, c])
    assert s.holds(b, "write") and not s.holds(b, "admin")
    assert s == AuthSettings(dict(s.items()))


def test_key_state_consistency():
    with pytest.raises(ValueError):
        KeyState(None, "active")
    with pytest.raises(ValueError):
        KeyState(Write(1), "revoked")
    with pytest.raises(ValueError):
        KeyState(Write(1), "paused")


# ---------------------------------------------------------------------------- parse_op


def test_parse_valid_ops_round_trip():
    for value in (
        {"op": "grant", "key": K, "perm": "admin", "priority": 0},
        {"op": "grant", "key": K, "perm": "write", "priority": 2**31 - 1},
        {"op": "grant", "key": K, "perm": "read"},
        {"op": "revoke", "key": K},
    ):
        op = parse_op(value)
        assert op.to_value() == value
    assert parse_op({"op": "grant", "key": K, "perm": "write", "priority": 4}) == GrantOp(K, "write", 4)
    assert parse_op({"op": "revoke", "key": K}) == RevokeOp(K)
    assert GrantOp(K, "admin", 3).permission == Admin(3)


BAD_VALUES = {
    "not_a_map": [("grant", K)],
    "none": None,
    "string": "grant",
    "non_string_field_name": {"op": "revoke", "key": K, 1: 2},
    "unknown_op": {"op": "promote", "key": K},
    "op_not_string": {"op": 1, "key": K},
    "op_missing": {"key": K, "perm": "read"},
    "grant_unknown_field": {"op": "grant", "key": K, "perm": "write", "priority": 1, "note": "x"},
    "grant_missing_key": {"op": "grant", "perm": "write", "priority": 1},
    "grant_missing_priority": {"op": "grant", "key": K, "perm": "admin"},
    "read_with_priority": {"op": "grant", "key": K, "perm": "read", "priority": 1},
    "read_with_null_priority": {"op": "grant", "key": K, "perm": "read", "priority": None},
    "unknown_perm": {"op": "grant", "key": K, "perm": "owner", "priority": 1},
    "perm_wrong_case": {"op": "grant", "key": K, "perm": "Admin", "priority": 1},
    "perm_not_string": {"op": "grant", "key": K, "perm": 1, "priority": 1},
    "priority_bool": {"op": "grant", "key": K, "perm": "admin", "priority": True},
    "priority_float": {"op": "grant", "key": K, "perm": "write", "priority": 1.0},
    "priority_string": {"op": "grant", "key": K, "perm": "write", "priority": "1"},
    "priority_negative": {"op": "grant", "key": K, "perm": "write", "priority": -1},
    "priority_too_big": {"op": "grant", "key": K, "perm": "admin", "priority": 2**31},
    "priority_null": {"op": "grant", "key": K, "perm": "admin", "priority": None},
    "revoke_unknown_field": {"op": "revoke", "key": K, "perm": "read"},
    "revoke_missing_key": {"op": "revoke"},
    "key_not_string": {"op": "revoke", "key": b"ed25519:" + K[8:].encode()},
    "key_no_prefix": {"op": "revoke", "key": K[8:]},
    "key_other_algorithm": {"op": "revoke", "key": "ed448:" + K[8:]},
    "key_too_short": {"op": "revoke", "key": K[:-1]},
    "key_too_long": {"op": "revoke", "key": K + "A"},
    "key_padded": {"op": "revoke", "key": K + "="},
    "key_standard_base64": {"op": "revoke", "key": "ed25519:" + "+" * 42 + "A"},
    "key_non_ascii": {"op": "revoke", "key": "ed25519:" + "é" * 43},
    "key_non_canonical": {"op": "revoke", "key": K[:-1] + "B"},  # padding bits set
}


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_parse_op_rejects_malformed(name):
    with pytest.raises(AuthError) as info:
        parse_op(BAD_VALUES[name])
    assert info.value.reason == "auth.bad_op"
    assert str(info.value)  # a human sentence


def test_ops_cannot_be_built_malformed():
    with pytest.raises(AuthError):
        GrantOp(K, "admin")
    with pytest.raises(AuthError):
        GrantOp(K, "read", 1)
    with pytest.raises(AuthError):
        RevokeOp("ed25519:short")
