"""Who holds what in a bank (`memory grants`), and grant and revoke of any key: a local agent, a
key, or a label that `memory grants` shows; a thief's key that redeemed a stolen invite over a
real loopback share; re-grants that write nothing; and bad references that answer 4xx, not 500.

Real homes (SQLite in tmp_path), real Ed25519 keys, the real HTTP app and sync server on
127.0.0.1, and one `memmesh` process for the command line.
"""
from __future__ import annotations

import json

import aiohttp
import pytest

from memmesh.auth.errors import AuthError
from memmesh.auth.keys import SigningKey
from memmesh.node import Node
from memmesh.node.commands.params import ParamsError
from memmesh.node.memory.agents import NotGranted
from memmesh.node.memory.holders import tag
from memmesh.node.registry import BankRecord, UnknownName
from memmesh.node.sync import messages as m
from memmesh.node.sync import sharing
from memmesh.node.sync.http import HttpTransport, call
from memmesh.node.sync.protocol import Client, SyncError
from memmesh.node.sync.state import now_ms
from memmesh.node.worker import run_here
from tests.test_api import api  # noqa: F401  (the fixture: the real app on 127.0.0.1, answers checked against OpenAPI)
from tests.test_cli import mm
from tests.test_sharing import _home, issuer  # noqa: F401  (the fixture: node A serving its sync API)

BANK = "notes"


def _node(tmp_path, name: str = "a") -> Node:
    node = Node.open(tmp_path / name)
    node.run("embedder.set", {"provider": "none"})
    node.run("agent.new", {"name": "alpha"})
    node.run("memory.new", {"name": BANK})
    node.run("memory.grant", {"bank": BANK, "agent": "alpha", "perm": "write"})
    return node


def _rows(node: Node, bank: str = BANK) -> dict[str, dict]:
    return {r["key"]: r for r in node.run("memory.grants", {"bank": bank}).data["keys"]}


def _written(node: Node) -> dict[str, int]:
    """Entries per database, and the invite records: what a grant or revoke could change."""
    return {**{d: len(node.database(d)) for d in node.database_ids()},
            "invites": sorted(node.storage.items_local("sync-invites"))}


def _remote_agent(tmp_path, node: Node, name: str) -> str:
    """An agent of another node whose database this node holds (copied entry by entry, signed
    by the other node's keys, and registered as a bank): its key, as that agent's meta names it."""
    other = Node.open(tmp_path / f"other-{name}")
    try:
        other.run("agent.new", {"name": name})
        agent = other.agents.agent(name)
        ids = sorted(agent.db.accepted_ids(), key=lambda i: agent.db.height_of(i))
        items, covered = agent.db.page(ids, 1 << 24)
        assert covered == len(ids)
        key = str(agent.key.public)
        db_id = agent.db.id
    finally:
        other.close()
    node.storage.add_database(db_id)
    result = node.database(db_id).ingest(items, source="test")
    assert len(result.accepted) == len(ids)
    node.registry.add_bank(BankRecord(f"{name}-db", db_id, "peer"))
    return key


def test_grants_names_every_key_with_a_label_that_grant_and_revoke_take_back(tmp_path):
    node = _node(tmp_path)
    bank = node.agents.resolve(BANK)
    stranger = str(SigningKey.generate().public)
    peer = str(SigningKey.generate().public)
    node.sync.peers.add(bank.db.id, peer, ["http:127.0.0.1:9"], "manual", now_ms())
    gamma = _remote_agent(tmp_path, node, "gamma")
    for key in (stranger, peer, gamma):
        node.run("memory.grant", {"bank": BANK, "agent": key, "perm": "read"})
    share = node.run("memory.share", {"bank": BANK, "perm": "write"}).data  # an invite; the peer key made admin
    invite = next(k for k, _ in node.storage.items_local("sync-invites"))
    alpha = str(node.agents.agent("alpha").key.public)
    me = str(node.peer_key.public)
    root = str(bank.admin_key.public)

    rows = _rows(node)
    expect = {alpha: ("alpha", "agent", "write", "active"), me: ("node:self", "node", "admin", "active"),
              root: ("bank:root", "bank", "admin", "active"),
              stranger: (f"key:{tag(stranger)}", "unknown", "read", "active"),
              peer: (f"peer:mm-{tag(peer)}", "peer", "read", "active"),
              gamma: ("agent:gamma", "remote_agent", "read", "active")}
    for key, (label, kind, perm, status) in expect.items():
        r = rows[key]
        assert (r["label"], r["is"]["kind"], r["permission"], r["status"]) == (label, kind, perm, status), r
    assert rows[alpha]["priority"] == 10 and rows[alpha]["granted_by"][0]["label"] == "bank:root"
    assert rows[me]["priority"] == 1 and rows[root]["priority"] == 0
    # The invite holds nothing in the settings until redeemed (or Read, in an older version):
    # it is listed either way, with its own label, as not redeemed yet.
    assert rows[invite]["label"] == f"invite:{tag(invite)}" and rows[invite]["is"]["kind"] == "invite"
    assert rows[invite]["invite"]["state"] == "outstanding" and rows[invite]["invite"]["perm"] == "write"
    assert len({r["label"] for r in rows.values()}) == len(rows)  # unambiguous
    text = node.run("memory.grants", {"bank": BANK}).text
    for key, (label, *_rest) in expect.items():
        assert label in text and key in text

    # Every label is accepted back: revoke by label, and the key then holds nothing.
    for key in (stranger, peer, gamma):
        node.run("memory.revoke", {"bank": BANK, "agent": rows[key]["label"]})
        assert bank.db.permission(key) is None
        assert _rows(node)[key]["status"] == "revoked" and _rows(node)[key]["revoked_by"][0]["label"] == "bank:root"
    node.run("memory.grant", {"bank": BANK, "agent": f"peer:mm-{tag(peer)}", "perm": "write"})
    assert bank.db.permission(peer).level == "write"
    # key:<16 hex> names any key, whatever else it is.
    node.run("memory.revoke", {"bank": BANK, "agent": f"key:{tag(peer)}"})
    assert bank.db.permission(peer) is None
    # Revoking the invite ends it: the ticket can no longer be redeemed.
    answer = node.run("memory.revoke", {"bank": BANK, "agent": rows[invite]["label"]})
    assert answer.data["invite_ended"] and "can no longer be redeemed" in answer.text
    assert node.sync.invite(invite).ended == "revoked" and bank.db.permission(invite) is None
    assert invite not in _rows(node)  # an ended invite is no longer listed
    assert share["ticket"]
    node.close()


def test_a_grant_of_what_a_key_already_holds_writes_nothing_and_says_so(tmp_path):
    node = _node(tmp_path)
    bank = node.agents.resolve(BANK)
    alpha = node.agents.agent("alpha")
    key = str(SigningKey.generate().public)
    node.run("memory.grant", {"bank": BANK, "agent": key, "perm": "read"})
    before = (len(bank.db), len(alpha.db))
    for who, perm in (("alpha", "write"), (str(alpha.key.public), "write"), (key, "read"), (f"key:{tag(key)}", "read")):
        answer = node.run("memory.grant", {"bank": BANK, "agent": who, "perm": perm})
        assert answer.data["changed"] is False and "nothing written" in answer.text, answer.text
        assert (len(bank.db), len(alpha.db)) == before
    # A change is written (one settings entry, one reference), and a repeated revoke is not.
    node.run("memory.grant", {"bank": BANK, "agent": "alpha", "perm": "read"})
    assert (len(bank.db), len(alpha.db)) == (before[0] + 1, before[1] + 1)
    node.run("memory.revoke", {"bank": BANK, "agent": key})
    after = len(bank.db)
    answer = node.run("memory.revoke", {"bank": BANK, "agent": key})
    assert answer.data["changed"] is False and "already revoked" in answer.text and len(bank.db) == after
    node.close()


def test_refused_grants_and_revokes_say_why_and_write_nothing(tmp_path):
    node = _node(tmp_path)
    node.run("memory.share", {"bank": BANK})
    invite = next(k for k, _ in node.storage.items_local("sync-invites"))
    before = _written(node)
    cases = [
        ("memory.revoke", "node:self", AuthError, "this node's peer key"),
        ("memory.revoke", str(node.peer_key.public), AuthError, "memmesh memory unshare notes"),
        ("memory.revoke", "bank:root", AuthError, "administers notes"),
        ("memory.grant", "node:self", AuthError, "this node's peer key"),
        ("memory.grant", invite, AuthError, "invite key"),
        ("memory.revoke", str(SigningKey.generate().public), NotGranted, "not in the settings of notes"),
        ("memory.revoke", "ed25519:not-a-key", ParamsError, "agent must be a key (ed25519: and 43 base64url"),
        ("memory.revoke", "", ParamsError, "agent must be a key (ed25519: and 43 base64url"),
        ("memory.revoke", "peer:mm-0000000000000000", UnknownName, "memmesh memory grants notes"),
        ("memory.revoke", "nobody", UnknownName, "no agent named 'nobody'"),
        # Refused by the parameters' schema, before any lookup: one clear line.
        ("memory.revoke", "no\x00body", ParamsError, "control character"),
    ]
    for command, who, error, says in cases:
        params = {"bank": BANK, "agent": who, **({"perm": "read"} if command == "memory.grant" else {})}
        with pytest.raises(error, match=says.replace("(", r"\(").replace(")", r"\)") if "|" not in says else says):
            node.run(command, params)
        assert _written(node) == before, (command, who)
    node.close()


async def test_a_thiefs_key_that_redeemed_a_stolen_invite_can_be_revoked(issuer, tmp_path):  # noqa: F811
    share = issuer.run("memory.share", {"bank": "project-notes", "perm": "write"}).data
    thief = _home(tmp_path, "thief")
    await sharing.import_ticket(thief, share["ticket"], "write", None, run_here)
    thief_key = str(thief.peer_key.public)
    bank = issuer.agents.resolve("project-notes")
    assert bank.db.permission(thief_key).level == "write"

    row = _rows(issuer, "project-notes")[thief_key]
    assert row["label"] == f"peer:mm-{tag(thief_key)}" and row["is"]["kind"] == "peer"
    assert "redeemed invite invite:" in row["is"]["detail"] and row["granted_by"][0]["label"] == "node:self"
    before = len(bank.db)
    answer = issuer.run("memory.revoke", {"bank": "project-notes", "agent": thief_key})
    assert answer.data["changed"] and len(bank.db) == before + 1
    assert bank.db.permission(thief_key) is None
    assert _rows(issuer, "project-notes")[thief_key]["status"] == "revoked"
    # The issuer no longer serves the bank to the thief's key.
    async with aiohttp.ClientSession() as session:
        with pytest.raises(SyncError):
            await call(HttpTransport(session), Client(thief.peer_key), issuer.sync.address(),
                       str(issuer.peer_key.public), m.FeedsRequest(bank.db.id, {}, {}))
    thief.close()


async def test_grants_over_http_and_an_empty_or_bad_ref_to_delete_is_4xx(api):  # noqa: F811
    status, answer, _ = await api.call("POST", "/v1/memory/grants", {"bank": "notes"})
    assert status == 200
    labels = {r["label"]: r for r in answer["data"]["keys"]}
    assert labels["alpha"]["permission"] == "write" and "bank:root" in labels
    status, answer, _ = await api.call("POST", "/v1/memory/grant", {"bank": "notes", "agent": "alpha", "perm": "write"})
    assert status == 200 and answer["data"]["changed"] is False
    key = str(SigningKey.generate().public)
    status, answer, _ = await api.call("POST", "/v1/memory/revoke", {"bank": "notes", "agent": key})
    assert status == 404 and "not in the settings of notes" in answer["error"]["message"]

    before = await api.written()
    for ref, expected in (("", {400}), ("no\x00bank", {400}), ("x" * 300, {400}), ("sha256:" + "0" * 64, {404})):
        status, answer, _ = await api.call("POST", "/v1/memory/delete", {"ref": ref}, valid=False)
        assert status in expected, (ref, answer)
        assert "\n" not in answer["error"]["message"]
    assert await api.written() == before


def test_grants_in_a_chat_line(tmp_path):
    node = _node(tmp_path)
    answer = node.run("command", {"agent": "alpha", "line": "/memory grants notes"})
    assert answer.data == node.run("memory.grants", {"bank": BANK}).data  # the one handler
    assert {r["label"] for r in answer.data["keys"]} == {"alpha", "bank:root"}
    assert "alpha" in answer.text and "bank:root" in answer.text
    key = str(SigningKey.generate().public)
    node.run("command", {"agent": "alpha", "line": f"/memory grant notes {key} read"})
    node.run("command", {"agent": "alpha", "line": f"/memory revoke notes key:{tag(key)}"})
    assert node.agents.resolve(BANK).db.settings().get(key).status == "revoked"
    node.close()


def test_grants_and_revoke_by_label_from_the_command_line(tmp_path):
    home = tmp_path / "h"
    node, _ = Node.init(home)
    node.run("memory.new", {"name": BANK})
    key = str(SigningKey.generate().public)
    node.run("memory.grant", {"bank": BANK, "agent": key, "perm": "read"})
    node.close()
    listed = json.loads(mm("memory", "grants", BANK, "--json", home=home).stdout)
    label = next(r["label"] for r in listed["keys"] if r["key"] == key)
    assert label == f"key:{tag(key)}"
    revoked = mm("memory", "revoke", BANK, label, home=home)
    assert f"revoked {label} on {BANK}" in revoked.stdout
    again = mm("memory", "revoke", BANK, label, home=home)
    assert "nothing written" in again.stdout
    bad = mm("memory", "delete", "", home=home, check=False)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    with Node.open(home) as node:
        assert node.agents.resolve(BANK).db.permission(key) is None
