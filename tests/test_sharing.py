"""Sharing banks with tickets, between real homes over a real loopback HTTP server (in one
process; the multi-process walkthrough is `make demo`, run by tests/test_demo.py)."""
from __future__ import annotations

import time

import pytest
from aiohttp import web

from memmesh.node import Node
from memmesh.node.sync import messages as m
from memmesh.node.sync import sharing
from memmesh.node.sync.service import SyncService
from memmesh.node.worker import run_here
from memmesh.tickets import TicketRejected, decode, encode


@pytest.fixture
async def issuer(tmp_path):
    """Node A serving its sync API on 127.0.0.1 (in this loop), with bank project-notes."""
    node = Node.open(tmp_path / "a")
    node.run("embedder.set", {"provider": "none"})
    node.run("agent.new", {"name": "alpha"})
    node.run("memory.new", {"name": "project-notes", "description": "shared notes"})
    node.run("memory.grant", {"bank": "project-notes", "agent": "alpha", "perm": "write"})
    node.run("remember", {"agent": "alpha", "key": "architecture.sessions", "value": "one DB per conversation",
                          "bank": "project-notes"})
    app = web.Application(client_max_size=m.MAX_BODY_BYTES)
    runner = web.AppRunner(app)
    service = SyncService(node, address="http:127.0.0.1:0", discovery=False, interval_s=3600)
    service.add_routes(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    service.address = f"http:127.0.0.1:{port}"
    node.sync.set_address(service.address)
    yield node
    await runner.cleanup()
    node.close()


def _home(tmp_path, name: str) -> Node:
    node = Node.open(tmp_path / name)
    node.run("embedder.set", {"provider": "none"})
    return node


def _nothing_written(node: Node, db_id: str) -> bool:
    return db_id not in node.database_ids() and not node.registry.banks() and not node.sync.shared()


async def test_invite_ticket_with_admin_then_grant_a_local_agent(issuer, tmp_path):
    share = issuer.run("memory.share", {"bank": "project-notes", "perm": "admin"}).data
    assert "#secret=" in share["ticket"] and share["perm"] == "admin"
    b = _home(tmp_path, "b")
    imported = await sharing.import_ticket(b, share["ticket"], "admin", None, run_here)
    assert (imported.name, imported.perm) == ("project-notes", "admin")
    bank = b.agents.resolve("project-notes")
    assert [r.value["value"] for r in bank.db.rows("memory")] == ["one DB per conversation"]
    # Admin from a ticket is weaker than its issuer's, and the redemption is in the signed log.
    a_db = issuer.agents.resolve("project-notes").db
    issuer_perm = a_db.permission(str(issuer.peer_key.public))
    b_perm = bank.db.permission(str(b.peer_key.public))
    assert b_perm.level == "admin" and b_perm.priority > issuer_perm.priority
    invite = decode(share["ticket"]).invite
    assert a_db.settings().get(invite) is None  # the invite key never held anything there
    # B administers the bank now: it grants its own agent.
    b.run("agent.new", {"name": "gamma"})
    b.run("memory.grant", {"bank": "project-notes", "agent": "gamma", "perm": "write"})
    assert bank.db.permission(str(b.agents.agent("gamma").key.public)).level == "write"
    # The invite works once: another node is refused, and nothing is written there.
    c = _home(tmp_path, "c")
    with pytest.raises(TicketRejected) as used:
        await sharing.import_ticket(c, share["ticket"], "write", None, run_here)
    assert used.value.reason == "ticket.used"
    assert c.registry.banks() == []
    b.close()
    c.close()


async def test_a_write_import_cannot_grant_and_says_what_to_do(issuer, tmp_path):
    share = issuer.run("memory.share", {"bank": "project-notes"}).data
    b = _home(tmp_path, "b")
    imported = await sharing.import_ticket(b, share["ticket"], "write", None, run_here)
    assert imported.perm == "write"
    b.run("agent.new", {"name": "gamma"})
    with pytest.raises(Exception, match="granting its agents needs admin on the bank"):
        b.run("memory.grant", {"bank": "project-notes", "agent": "gamma", "perm": "write"})
    b.close()


async def test_recipient_ticket(issuer, tmp_path):
    b = _home(tmp_path, "b")
    c = _home(tmp_path, "c")
    share = issuer.run("memory.share", {"bank": "project-notes", "perm": "read",
                                        "recipient": str(b.peer_key.public)}).data
    assert "#secret=" not in share["ticket"]
    with pytest.raises(TicketRejected) as wrong:
        await sharing.import_ticket(c, share["ticket"], "read", None, run_here)
    assert wrong.value.reason == "ticket.recipient" and _nothing_written(c, share["db"])
    imported = await sharing.import_ticket(b, share["ticket"], "read", None, run_here)
    assert imported.perm == "read"
    b.close()
    c.close()


async def test_refused_tickets_write_nothing(issuer, tmp_path):
    share = issuer.run("memory.share", {"bank": "project-notes", "perm": "write"}).data
    c = _home(tmp_path, "c")
    # more than the ticket gives
    with pytest.raises(TicketRejected) as more:
        await sharing.import_ticket(c, share["ticket"], "admin", None, run_here)
    assert more.value.reason == "ticket.permission"
    # a changed field (another database id), a changed character anywhere
    t = decode(share["ticket"])
    text = share["ticket"]
    i = text.index("&perm=")
    flipped = text[:i] + text[i:].replace("write", "admin", 1)
    with pytest.raises(TicketRejected):
        await sharing.import_ticket(c, flipped, "admin", None, run_here)
    # expired: the issuer signs one that expired a second ago
    expired = issuer.run("memory.share", {"bank": "project-notes", "expires": "1"}).data["ticket"]
    with pytest.raises(TicketRejected) as old:  # two seconds later by the importer's clock
        await sharing.import_ticket(c, expired, "write", None, run_here, clock=lambda: time.time() + 2)
    assert old.value.reason == "ticket.expired"
    assert _nothing_written(c, t.db)
    c.close()


async def test_unshare_stops_serving(issuer, tmp_path):
    share = issuer.run("memory.share", {"bank": "project-notes", "perm": "read"}).data
    issuer.run("memory.unshare", {"bank": "project-notes"})
    b = _home(tmp_path, "b")
    with pytest.raises(TicketRejected, match="ended this invite when the bank was unshared") as ended:
        await sharing.import_ticket(b, share["ticket"], "read", None, run_here)
    assert ended.value.reason == "ticket.ended" and _nothing_written(b, share["db"])
    # Unsharing ended the invite for good: sharing again serves the bank to new tickets only.
    again = issuer.run("memory.share", {"bank": "project-notes", "perm": "read"}).data
    with pytest.raises(TicketRejected, match="ended"):
        await sharing.import_ticket(b, share["ticket"], "read", None, run_here)
    imported = await sharing.import_ticket(b, again["ticket"], "read", None, run_here)
    assert imported.perm == "read"
    b.close()


async def test_a_ticket_for_a_database_the_issuer_does_not_serve_writes_nothing(issuer, tmp_path):
    """Signed by the issuing node itself, but for another database: refused, nothing written."""
    from memmesh.auth.keys import SigningKey
    from memmesh.tickets import issue

    other_db = "sha256:" + "ab" * 32
    forged = encode(issue(issuer.peer_key, db=other_db, addresses=[issuer.sync.address()], perm="write",
                          priority=10, invite=SigningKey.generate(), expires=int(time.time()) + 600))
    b = _home(tmp_path, "b")
    with pytest.raises(sharing.ShareError, match="no such database"):
        await sharing.import_ticket(b, forged, "write", None, run_here)
    assert _nothing_written(b, other_db)
    # ... and a ticket for a bank the issuer serves, but with the invite of another ticket.
    real = decode(issuer.run("memory.share", {"bank": "project-notes"}).data["ticket"])
    swapped = encode(issue(issuer.peer_key, db=real.db, addresses=list(real.addresses), perm="write", priority=10,
                           invite=SigningKey.generate(), expires=real.expires))
    with pytest.raises(sharing.ShareError, match="no such database"):
        await sharing.import_ticket(b, swapped, "write", None, run_here)
    assert b.registry.banks() == []
    b.close()


async def test_a_recipient_ticket_for_a_bank_not_served_writes_nothing(issuer, tmp_path):
    b = _home(tmp_path, "b")
    share = issuer.run("memory.share", {"bank": "project-notes", "perm": "read", "recipient": str(b.peer_key.public)}).data
    issuer.run("memory.unshare", {"bank": "project-notes"})
    with pytest.raises(sharing.ShareError, match="does not serve this bank to this node"):
        await sharing.import_ticket(b, share["ticket"], "read", None, run_here)
    assert _nothing_written(b, share["db"])
    b.close()


def test_share_from_the_command_line(tmp_path):
    """`memory share BANK --for KEY` and bad input, through the CLI as a user types it."""
    import json

    from tests.test_cli import mm

    home = tmp_path / "cli"
    node = _home(tmp_path, "cli")
    node.run("memory.new", {"name": "notes"})
    node.close()
    other = "ed25519:Kay64UG8yvCyLhqU000LxzYeUm0L_hLIl5S8kyKWbdc"
    data = json.loads(mm("memory", "share", "notes", "--perm", "read", "--for", other, "--json", home=home).stdout)
    assert decode(data["ticket"]).recipient == other and data["perm"] == "read"
    bad = mm("memory", "share", "notes", "--expires", "5x", home=home, check=False)
    assert bad.returncode == 1 and "expires must be a duration such as 30m" in bad.stderr
