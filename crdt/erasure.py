"""Signed erasure: the rows of the ``_erase`` store and what they decide (pure).

A payload is erased only by a signed entry: one row of the append-only ``_erase`` store per
payload, ``{"op": "erase", "entry": ID, "store": NAME, "author": KEY}``. ``author`` names the
author of the target entry, so the permission an erase needs is known from the erase alone:
Write when every target is its own author's entry, Admin otherwise. It is judged by the
validity rule like any entry, and it does not need the target in its causal past: a node that
received the target without its payload (because the sender had already erased it) can take
the header in as soon as an erase covering it is stored, with no cycle between the two.

A row acts only on the entry and store it names, and only if the entry's real author is the
``author`` it names: a wrong claim erases nothing. ``_settings`` and ``_erase`` payloads are
never erased (authorisation and erasure depend on them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memmesh.auth.errors import AuthError
from memmesh.auth.ops import check_key
from memmesh.crdt.entry import id_to_raw
from memmesh.crdt.errors import EntryRejected

ERASE = "_erase"
SETTINGS = "_settings"
UNERASABLE = frozenset({SETTINGS, ERASE})
_FIELDS = ("author", "entry", "op", "store")


@dataclass(frozen=True, slots=True)
class EraseOp:
    entry: str  # the target entry id
    store: str  # the store whose payload is erased
    author: str  # the target entry's author, as the erase claims it

    def value(self) -> dict[str, Any]:
        return {"op": "erase", "entry": self.entry, "store": self.store, "author": self.author}


def parse_erase(value: object, *, valid_store: Any) -> EraseOp:
    """A strictly parsed erase row; EntryRejected("erase.bad_op") for anything else."""
    if not isinstance(value, dict) or sorted(value) != list(_FIELDS) or value.get("op") != "erase":
        raise EntryRejected("erase.bad_op", f"an erase row is exactly {{{', '.join(_FIELDS)}}} with op 'erase'")
    entry, store, author = value["entry"], value["store"], value["author"]
    try:
        id_to_raw(entry)
    except EntryRejected:
        raise EntryRejected("erase.bad_op", f"erase names an invalid entry id {entry!r}") from None
    if not isinstance(store, str) or not valid_store(store):
        raise EntryRejected("erase.bad_op", f"erase names an invalid store {store!r}")
    if store in UNERASABLE:
        raise EntryRejected("erase.bad_op", f"{store} payloads are never erased: authorisation depends on them")
    try:
        check_key(author)
    except AuthError:
        raise EntryRejected("erase.bad_op", f"erase names an invalid author key {author!r}") from None
    return EraseOp(entry, store, author)
