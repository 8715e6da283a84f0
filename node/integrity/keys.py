"""Keys and peer-local records: what `memmesh check` verifies beside the signed logs.

Keys (``HOME/keys/``): every key file loads with mode 0600 (node/keystore.py's own checks and
messages), the peer key is there, and every key the registry names for an agent or a bank is
there and holds a permission in its database. A repair cannot bring any of them back: private
keys never leave the node, so the fix is a backup (or, for a mode, the chmod the message gives).

Peer-local records (never synced, so never fetched again): the agent and bank registry must
parse and name databases storage holds; access counts naming an unknown database are noted.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memmesh.auth.keys import SigningKey
from memmesh.crdt.errors import StorageError
from memmesh.crdt.storage import Storage
from memmesh.node.integrity.report import Problem
from memmesh.node.keystore import KeyStoreError, load_key
from memmesh.node.memory.access import NS_ACCESS
from memmesh.node.registry import NS_AGENTS, NS_ARCHIVE, NS_BANKS

KEYS_DIR = "keys"  # node.home.KEYS_DIR (not imported: home imports the database layer's open path)
PEER_KEY = "peer.key"

_KINDS = {NS_AGENTS: "agent", NS_BANKS: "bank", NS_ARCHIVE: "archived bank"}


@dataclass(frozen=True)
class Named:
    """A registry record: which database a name stands for, and the key it acts with."""

    kind: str  # "agent", "bank", "archived bank"
    name: str
    db_id: str
    key_name: str


def registry_records(storage: Storage, known: set[str]) -> tuple[list[Named], list[Problem]]:
    """Every agent and bank record that parses, and the problems of the others."""
    named: list[Named] = []
    problems: list[Problem] = []
    for ns, kind in _KINDS.items():
        try:
            items = storage.items_local(ns)
        except (StorageError, ValueError) as exc:  # damaged text is a ValueError
            problems.append(Problem("local.damaged", f"the {ns} records cannot be read: {exc}"))
            continue
        for key, raw in items:
            try:
                rec = json.loads(raw)
                name, db_id, key_name = rec["name"], rec["db_id"], rec["key_name"]
                if not all(isinstance(v, str) for v in (name, db_id, key_name)):
                    raise TypeError("a field is not text")
            except (ValueError, KeyError, TypeError) as exc:
                problems.append(Problem("local.damaged", f"the {kind} record {key!r} cannot be read ({exc}); the "
                                        f"registry is peer-local, so no peer has it: restore a backup"))
                continue
            if db_id not in known:
                problems.append(Problem("local.unknown_db", f"the {kind} {name!r} stands for database {db_id}, "
                                        "which storage does not hold: restore a backup", damage=kind != "archived bank"))
            named.append(Named(kind, name, db_id, key_name))
    try:
        stale = sum(1 for key, _ in storage.items_local(NS_ACCESS) if key.split(" ", 1)[0] not in known)
    except (StorageError, ValueError) as exc:
        problems.append(Problem("local.damaged", f"the access counts cannot be read: {exc}", damage=False))
        stale = 0
    if stale:
        problems.append(Problem("local.stale", f"{stale} access-count record{'s' if stale != 1 else ''} name a "
                                "database this node does not hold; they are ignored", damage=False))
    return named, problems


class KeyCheck:
    """The key files of a home, loaded once."""

    def __init__(self, home: Path) -> None:
        self.dir = home / KEYS_DIR
        self.loaded: dict[str, SigningKey] = {}
        self.problems: list[Problem] = []
        self.checked = 0
        files = sorted(p for p in self.dir.iterdir() if p.is_file() and p.suffix == ".key") if self.dir.is_dir() else []
        for path in files:
            self.checked += 1
            try:
                self.loaded[path.stem] = load_key(path)
            except KeyStoreError as exc:
                code = "key.mode" if "readable by other users" in str(exc) else "key.damaged"
                self.problems.append(Problem(code, str(exc) if code == "key.mode" else
                                             f"{exc}; restore it from a backup (a private key is never synced)"))
        if not (self.dir / PEER_KEY).exists():
            self.problems.append(Problem("key.missing", f"the peer key {self.dir / PEER_KEY} is missing: the node "
                                         "cannot sign sync requests; restore it from a backup"))

    @property
    def peer_key(self) -> SigningKey | None:
        return self.loaded.get(PEER_KEY[:-4])

    def check_named(self, named: list[Named], holds: Callable[[str, str], bool | None]) -> None:
        """Every key the registry names is there and ``holds(db_id, public key)`` in its
        database (None: the database could not be rebuilt, so that is not checked)."""
        for rec in named:
            path = self.dir / f"{rec.key_name}.key"
            key = self.loaded.get(rec.key_name)
            if key is None:
                if not path.exists():
                    self.problems.append(Problem(
                        "key.missing", f"the key of {rec.kind} {rec.name}, {path}, is missing: it cannot write to "
                        "its database; restore it from a backup", damage=rec.kind != "archived bank"))
                continue  # a key that does not load is reported already
            if holds(rec.db_id, str(key.public)) is False:
                self.problems.append(Problem(
                    "key.mismatch", f"{path} holds {key.public}, which has no permission in the database of "
                    f"{rec.kind} {rec.name} ({rec.db_id}): it is not the key this {rec.kind} acts with; restore the "
                    "right key file from a backup", damage=rec.kind != "archived bank"))
