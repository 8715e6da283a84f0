"""`make demo`: a short, real demonstration of signed, key-authorised databases.

A node is created in a temporary home (real SQLite file, real Ed25519 keys). Its bank database
grants two writers; a third key, never granted, tries to write; one writer is revoked while a
second replica, that has not heard of it yet, keeps writing. Every entry is then shown with the
node's own explanation of why it was accepted or refused.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from auth.errors import AuthError
from auth.ops import GrantOp, RevokeOp
from crdt.database import Database
from crdt.entry import client_id_for, sign_entry
from crdt.yjs import encode_rows
from node.home import Home


def _say(text: str = "") -> None:
    print(text, flush=True)


def _short(key: object) -> str:
    text = str(key)
    return text[:20] + "…"


def run(home: Path) -> int:
    node, _ = Home.init(home)
    _say(f"node home      {home}")
    _say(f"peer key       {node.peer_key.public}")
    bank_key = node.new_key("bank-demo")
    alice, bob, mallory = node.new_key("alice"), node.new_key("bob"), node.new_key("mallory")
    bank = node.create_database(bank_key, {"kind": "bank", "display_name": "project-notes",
                                           "description": "a demo bank"})
    names = {str(bank_key.public): "bank admin", str(alice.public): "alice",
             str(bob.public): "bob", str(mallory.public): "mallory"}
    _say(f"bank database  {bank.id}")
    _say()
    _say("1. the bank's admin grants alice and bob Write")
    bank.change_settings(bank_key, [GrantOp(str(alice.public), "write", 10),
                                    GrantOp(str(bob.public), "write", 10)])
    with bank.transaction(alice) as txn:
        txn.append("memory", {"key": "deploy", "value": "nix build && scp to prod", "tags": ["ops"]})
    with bank.transaction(bob) as txn:
        txn.append("memory", {"key": "deadline", "value": "2026-06-01", "tags": ["project"]})
    _say("   alice and bob each wrote a memory")

    _say("2. mallory, never granted, tries to write")
    try:
        bank.transaction(mallory)
    except AuthError as exc:
        _say(f"   refused locally: {exc}")
    # Mallory signs an entry by hand and offers it as a peer would.
    c = client_id_for(mallory.public.raw)
    forged = sign_entry(mallory, db=bank.id, seq=0, prev=None, parents=list(bank.heads), ts=0,
                        payloads={"memory": (encode_rows(c, 0, "memory", [(f"{c}/0", {"key": "x", "value": "spam"})]), 0, 1)})
    result = bank.ingest([(forged.header, dict(forged.payloads))])
    for _, reason, detail in result.rejected:
        _say(f"   refused from the network ({reason}): {detail}")

    _say("3. bob's laptop copies the bank, then the admin revokes bob")
    laptop_storage_home = home / "bob-laptop"
    laptop = Home.init(laptop_storage_home)[0]
    laptop.storage.add_database(bank.id)
    replica = Database(laptop.storage, bank.id)
    replica.ingest((s.header, dict(s.payloads)) for s in node.storage.entries(bank.id))
    bank.change_settings(bank_key, [RevokeOp(str(bob.public))])
    with replica.transaction(bob) as txn:  # the laptop has not heard of the revocation
        txn.append("memory", {"key": "deadline", "value": "2027-01-01 (moved by bob, offline)"})
    _say("   bob, offline, writes on the laptop; then the laptop syncs with the node")
    bank.ingest((s.header, dict(s.payloads)) for s in laptop.storage.entries(bank.id))
    replica.ingest((s.header, dict(s.payloads)) for s in node.storage.entries(bank.id))

    _say()
    _say("every entry of the bank, as the node judges it:")
    for stored in node.storage.entries(bank.id):
        v = bank.verdict(stored.id)
        who = names.get(bank.entry(stored.id).author_key, "?")
        mark = "accepted" if v.accepted else f"REJECTED ({v.reason})"
        _say(f"  {stored.id[:19]}…  {who:<10} {mark}")
        text = bank.explain(stored.id)
        for key_text, name in names.items():  # readable: names instead of 43-character keys
            text = text.replace(key_text, name)
        for line in text.splitlines():
            _say(f"      {line}")
    _say()
    _say("memories the bank holds now (same on both replicas: "
         f"{[r.value for r in bank.rows('memory')] == [r.value for r in replica.rows('memory')]}):")
    for row in bank.rows("memory"):
        _say(f"  {row.value['key']:<10} {row.value['value']:<40} by {names.get(row.author, '?')}")
    _say()
    _say(f"reopening the node from disk gives the same state: "
         f"{Database.open(node.storage, bank.id).accepted_ids() == bank.accepted_ids()}")
    laptop.close()
    node.close()
    return 0


def main() -> int:
    if len(sys.argv) > 1:
        return run(Path(sys.argv[1]))
    with tempfile.TemporaryDirectory(prefix="memmesh-demo-") as tmp:
        return run(Path(tmp) / "node")


if __name__ == "__main__":
    sys.exit(main())
