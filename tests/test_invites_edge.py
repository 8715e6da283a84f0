"""Invites give nothing before they are redeemed, and die with their bank (issue 19, section 3).

An invite key may do one thing: redeem its invite, once, before its expiry. It is never served
a page nor pushed to, before or after its expiry, even an invite of an older version that was
granted Read in the bank's settings. `memory unshare` and `memory delete` end a bank's
unredeemed invites. A refused share or import changes nothing. A stranger's redeem does the
same work whatever database id it names.

The issuing node is a real `memmesh serve` process on 127.0.0.1 where the hole is on the wire;
importers are real homes in this process, reaching it over HTTP.
"""
from __future__ import annotations

import http.client
import http.server
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memmesh.auth.keys import DOMAIN_TICKET_REDEEM, SigningKey
from memmesh.auth.ops import GrantOp
from memmesh.node import Node
from memmesh.node.registry import NameTaken
from memmesh.node.sync import messages as m
from memmesh.node.sync import sharing
from memmesh.node.sync.protocol import Client, SyncServer
from memmesh.node.sync.service import ServedNode
from memmesh.node.sync.state import Invite
from memmesh.node.worker import run_here
from memmesh.tickets import TicketRejected, decode, encode, issue
from tests.procs import Serve, processes, until
from tests.test_cli import mm

BANK = "project-notes"
REACH_S = 15.0


# ----------------------------------------------------------------------------- helpers
def _init(home: Path, *, memories: int = 3) -> None:
    """A home with agent alpha and the bank BANK holding ``memories`` memories."""
    node, _ = Node.init(home)
    with node:
        node.run("embedder.set", {"provider": "none"})
        node.run("agent.new", {"name": "alpha"})
        node.run("memory.new", {"name": BANK, "description": "shared notes"})
        node.run("memory.grant", {"bank": BANK, "agent": "alpha", "perm": "write"})
        for i in range(memories):
            node.run("remember", {"agent": "alpha", "key": f"note.{i}", "value": f"note {i}", "bank": BANK})


def _legacy_invite(home: Path, perm: str = "read") -> tuple[SigningKey, str]:
    """What an older version's `memory share` left: an invite key granted Read in the bank's
    settings, and its local record. Returns the invite key and the ticket's text."""
    with Node.open(home) as node:
        bank, _priority = sharing.ensure_peer_admin(node, BANK)
        key = SigningKey.generate()
        ticket = issue(node.peer_key, db=bank.db.id, addresses=["http:127.0.0.1:9"], perm=perm, priority=None,
                       invite=key, expires=int(time.time()) + 3600)
        bank.db.change_settings(node.peer_key, [GrantOp(str(key.public), "read", None)])
        node.sync.put_invite(str(key.public), Invite(bank.db.id, perm, None, ticket.expires,
                                                     encode(ticket.without_secret())))
        node.sync.share(bank.db.id)
        return key, encode(ticket)


def _importer(tmp_path: Path, name: str) -> Node:
    node = Node.open(tmp_path / name)
    node.run("embedder.set", {"provider": "none"})
    return node


def _post(port: int, out) -> tuple[int, bytes]:
    r = out.request
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", r.path, body=r.body, headers={"Content-Type": "application/msgpack", **r.headers})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _read_as(key: SigningKey, serve: Serve, db: str, op: str) -> tuple[int, bytes]:
    """A feeds or pull request for ``db`` signed by ``key``: status and body of the answer."""
    msg = m.FeedsRequest(db, {}) if op == "feeds" else m.PullRequest(db, {})
    return _post(serve.port, Client(key).request(serve.node_key, msg))


def _as_a_random_id(key: SigningKey, serve: Serve, db: str) -> None:
    """``key`` is answered for ``db`` exactly as for a database that does not exist."""
    random_db = "sha256:" + os.urandom(32).hex()
    for op in ("feeds", "pull"):
        real, unknown = _read_as(key, serve, db, op), _read_as(key, serve, random_db, op)
        assert real == unknown and real[0] == 404, (op, real, unknown)
        assert m.ErrorReply.decode(m.unpack(real[1])).error == "sync.not_found"


def _entries(serve: Serve, bank: str = BANK) -> int:
    [db] = [d for d in serve.run("status", {}).data["databases"] if d["name"] == bank]
    return int(db["entries"])


def _keys(serve: Serve, bank: str = BANK) -> dict[str, str]:
    [b] = [b for b in serve.run("memory.list", {}).data["banks"] if b["name"] == bank]
    return {k["key"]: k["permission"] for k in b["keys"]}


def _nothing_on(node: Node, db_id: str, databases_before: list[str]) -> None:
    assert node.storage.databases() == databases_before
    assert db_id not in node.database_ids()
    assert all(b.db_id != db_id for b in node.registry.banks()) and db_id not in node.sync.shared()


def _invite_key(ticket: str) -> SigningKey:
    key = decode(ticket).invite_key()
    assert key is not None
    return key


# ----------------------------------------------------------------------------- on the wire
@pytest.mark.slow
def test_an_invite_key_reads_nothing_before_or_after_its_expiry(tmp_path):
    home = tmp_path / "a"
    _init(home)
    legacy, _legacy_ticket = _legacy_invite(home)
    with processes() as procs:
        sa = procs.serve(home, interval=60).start().wait_ready()
        db_id = sa.run("memory.list", {}).data["banks"][0]["id"]
        # An older version's invite was granted Read in the settings: serve revoked that grant as
        # it started (so no other replica serves it once it syncs), and serves it nothing.
        assert str(legacy.public) not in _keys(sa)
        assert "invites.old_grants_revoked" in sa.log() and "keys=1" in sa.log()
        _as_a_random_id(legacy, sa, db_id)
        share = sa.run("memory.share", {"bank": BANK, "perm": "write", "expires": "2"}).data
        invite = _invite_key(share["ticket"])
        assert str(invite.public) not in _keys(sa)  # a new invite is granted nothing
        _as_a_random_id(invite, sa, db_id)  # before its expiry
        until(lambda: time.time() >= share["expires"] + 0.05, 10, "the invite to expire")
        _as_a_random_id(invite, sa, db_id)  # after it
        # Past its expiry it does not redeem either (its holder is told why), and writes nothing.
        before = _entries(sa)
        importer = SigningKey.generate()
        bare = encode(decode(share["ticket"]).without_secret())
        proof = invite.sign(DOMAIN_TICKET_REDEEM, m.redemption_message(db_id, str(importer.public), bare, "write"))
        status, body = _post(sa.port, Client(importer).request(sa.node_key, m.RedeemRequest(db_id, bare, "write", proof)))
        assert status == 400 and m.ErrorReply.decode(m.unpack(body)).error == "ticket.expired", body
        assert _entries(sa) == before and str(importer.public) not in _keys(sa)
        assert sa.stop() == 0


class _Recorder:
    """An HTTP server on 127.0.0.1 that records every request and answers 404: it stands at
    the address a peer names for a key, and tells whether the node ever contacted that key."""

    def __init__(self) -> None:
        calls: list[tuple[str, str]] = []
        self.calls = calls

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server hook
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(min(length, 1 << 20))
                calls.append((self.path, self.headers.get("memmesh-target", "")))
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"http:127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow
def test_an_unredeemed_invite_key_is_never_pushed_to(tmp_path):
    home = tmp_path / "a"
    _init(home)
    legacy, _legacy_ticket = _legacy_invite(home)
    reader, other_reader = SigningKey.generate(), SigningKey.generate()
    recorders = {name: _Recorder() for name in ("invite", "legacy", "reader")}
    try:
        with processes() as procs:
            sa = procs.serve(home, interval=0.5).start().wait_ready()
            for key in (reader, other_reader):
                sa.run("memory.share", {"bank": BANK, "perm": "read", "recipient": str(key.public)})
            share = sa.run("memory.share", {"bank": BANK, "perm": "write"}).data
            invite = _invite_key(share["ticket"])
            # A reader names three peers: the invite key, the old-style invite key, another reader.
            named = [m.PeerInfo(str(invite.public), (recorders["invite"].address,)),
                     m.PeerInfo(str(legacy.public), (recorders["legacy"].address,)),
                     m.PeerInfo(str(other_reader.public), (recorders["reader"].address,))]
            status, body = _post(sa.port, Client(reader).request(sa.node_key, m.PeersRequest(share["db"], named)))
            assert status == 200, body
            sa.run("remember", {"agent": "alpha", "key": "after", "value": "written after the peers were named",
                                "bank": BANK})
            # The daemon contacts the reader it was told of (so it did take the names in), and
            # keeps trying it after its failures; never the invite keys.
            until(lambda: len(recorders["reader"].calls) >= 2, REACH_S,
                  lambda: f"two rounds to contact the named reader (calls: {recorders['reader'].calls})")
            assert recorders["invite"].calls == [] and recorders["legacy"].calls == []
            assert sa.stop() == 0
    finally:
        for r in recorders.values():
            r.close()


@pytest.mark.slow
async def test_an_invite_redeems_once_and_ends_with_unshare_and_delete(tmp_path):
    home = tmp_path / "a"
    _init(home)
    with _importer(tmp_path, "b") as b, _importer(tmp_path, "c") as c, processes() as procs:
        sa = procs.serve(home, interval=60).start().wait_ready()
        once = sa.run("memory.share", {"bank": BANK, "perm": "write"}).data
        before_unshare = sa.run("memory.share", {"bank": BANK, "perm": "read"}).data
        db_id = once["db"]
        entries = _entries(sa)
        imported = await sharing.import_ticket(b, once["ticket"], "write", None, run_here)
        assert (imported.name, imported.perm, imported.entries) == (BANK, "write", entries + 1)
        assert _entries(sa) == entries + 1  # the redemption: one settings entry
        assert _keys(sa)[str(b.peer_key.public)] == "write"
        # Once: another node is refused and nothing is written there; the spent invite key
        # reads nothing either.
        c_dbs = c.storage.databases()
        with pytest.raises(TicketRejected) as used:
            await sharing.import_ticket(c, once["ticket"], "write", None, run_here)
        assert used.value.reason == "ticket.used"
        _nothing_on(c, db_id, c_dbs)
        _as_a_random_id(_invite_key(once["ticket"]), sa, db_id)

        # unshare ends every unredeemed invite, for good: sharing again does not revive it.
        unshared = sa.run("memory.unshare", {"bank": BANK}).data
        again = sa.run("memory.share", {"bank": BANK, "perm": "read"}).data
        with pytest.raises(TicketRejected, match="ended this invite when the bank was unshared") as ended:
            await sharing.import_ticket(c, before_unshare["ticket"], "read", None, run_here)
        assert ended.value.reason == "ticket.ended"
        _nothing_on(c, db_id, c_dbs)
        assert unshared["invites_ended"] == 1

        # delete ends them too (the database stays as an archive: the invite must not open it).
        sa.run("memory.delete", {"ref": BANK})
        with pytest.raises(TicketRejected, match="ended this invite when the bank was deleted") as deleted:
            await sharing.import_ticket(c, again["ticket"], "read", None, run_here)
        assert deleted.value.reason == "ticket.ended"
        _nothing_on(c, db_id, c_dbs)
        assert sa.stop() == 0


@pytest.mark.slow
async def test_a_refused_import_leaves_nothing_and_the_invite_still_imports(tmp_path):
    home = tmp_path / "a"
    _init(home)
    with _importer(tmp_path, "b") as b, _importer(tmp_path, "c") as c:
        b.run("memory.new", {"name": "mine"})
        b.run("memory.new", {"name": BANK})  # the name the shared bank goes by
        with processes() as procs:
            sa = procs.serve(home, interval=60).start().wait_ready()
            first = sa.run("memory.share", {"bank": BANK, "perm": "write"}).data
            second = sa.run("memory.share", {"bank": BANK, "perm": "write"}).data
            db_id = first["db"]

            # A name given and taken: refused before the invite is redeemed. Nothing on B,
            # nothing on A, and the invite still imports (on another node here).
            b_dbs, a_entries = b.storage.databases(), _entries(sa)
            with pytest.raises(NameTaken, match="'mine' is already a bank on this node"):
                await sharing.import_ticket(b, first["ticket"], "write", "mine", run_here)
            _nothing_on(b, db_id, b_dbs)
            assert _entries(sa) == a_entries
            got = await sharing.import_ticket(c, first["ticket"], "write", None, run_here)
            assert got.name == BANK and db_id in c.database_ids()

            # The bank's own name taken (known only once it is copied): nothing stored on B,
            # and the ticket imports on B under another name (the issuer kept B's redemption).
            with pytest.raises(NameTaken, match=f"'{BANK}' is already a bank on this node"):
                await sharing.import_ticket(b, second["ticket"], "write", None, run_here)
            _nothing_on(b, db_id, b_dbs)
            got = await sharing.import_ticket(b, second["ticket"], "write", "theirs", run_here)
            assert got.name == "theirs" and [r.name for r in b.registry.banks() if r.db_id == db_id] == ["theirs"]
            assert len(b.database(db_id).rows("memory")) == 3
            assert sa.stop() == 0


# ----------------------------------------------------------------------------- in one process
def test_share_with_bad_input_writes_nothing(tmp_path):
    """`memory share BANK --for notakey` (and other refused shares) through the CLI as a user
    types it: an error line, and the bank's settings and the node's invites as they were."""
    home = tmp_path / "cli"
    with Node.open(home) as node:
        node.run("embedder.set", {"provider": "none"})
        node.run("memory.new", {"name": "notes"})

    def state() -> tuple[int, int, list[str], int]:
        with Node.open(home) as node:
            db = node.agents.resolve("notes").db
            return len(db), len(db.rows("_settings")), node.sync.shared(), len(node.storage.items_local("sync-invites"))

    before = state()
    with Node.open(home) as node:
        own = str(node.peer_key.public)
    for args, said in ((["--for", "notakey"], "recipient must be a public key (ed25519:"),
                       (["--for", own], "--for names this node's own key"),
                       (["--expires", "0"], "must expire in the future"),
                       (["--expires", "5x"], "expires must be a duration such as 30m")):
        bad = mm("memory", "share", "notes", *args, home=home, check=False)
        assert bad.returncode == 1 and said in bad.stderr and "Traceback" not in bad.stderr, (args, bad.stderr)
        assert state() == before, args


def _spy(calls: list[str], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return fn(*args, **kwargs)
    return spy


def test_a_strangers_redeem_does_the_same_work_whatever_the_id(tmp_path, monkeypatch):
    """Timing cannot tell a shared id from another: for any request, the functions a redeem
    calls, in order, are the same for a shared database, one that exists unshared and one that
    does not, and none of them looks the id up until the proof shows an invite of this node."""
    node = Node.open(tmp_path / "a")
    try:
        node.run("embedder.set", {"provider": "none"})
        node.run("memory.new", {"name": BANK})
        node.run("memory.new", {"name": "private"})
        node.sync.set_address("http:127.0.0.1:7411")
        real = node.run("memory.share", {"bank": BANK, "perm": "write"}).data
        shared, unshared = real["db"], node.agents.resolve("private").db.id
        ids = {"shared": shared, "unshared": unshared, "random": "sha256:" + os.urandom(32).hex()}
        server = SyncServer(node.peer_key, ServedNode(node))
        stranger = SigningKey.generate()
        bare = encode(decode(real["ticket"]).without_secret())

        calls: list[str] = []
        monkeypatch.setattr(sharing, "decode", _spy(calls, "decode", sharing.decode))
        monkeypatch.setattr(sharing, "verify", _spy(calls, "verify", sharing.verify))
        for name in ("invite", "is_shared", "is_invite", "invites", "shared"):  # a rename fails here
            monkeypatch.setattr(node.sync, name, _spy(calls, f"sync.{name}", getattr(node.sync, name)))
        for name in ("database", "database_ids"):
            monkeypatch.setattr(node, name, _spy(calls, name, getattr(node, name)))

        def requests(db: str) -> dict[str, tuple[str, bytes]]:
            own_invite = SigningKey.generate()  # a ticket the stranger signed itself, for this id
            forged = encode(issue(stranger, db=db, addresses=["http:127.0.0.1:9"], perm="read", priority=None,
                                  invite=own_invite, expires=int(time.time()) + 600).without_secret())
            caller = str(stranger.public)
            return {
                "its own ticket": (forged, own_invite.sign(DOMAIN_TICKET_REDEEM,
                                                           m.redemption_message(db, caller, forged, "read"))),
                "the real ticket without its secret": (bare, stranger.sign(
                    DOMAIN_TICKET_REDEEM, m.redemption_message(db, caller, bare, "read"))),
                "garbage": ("memmesh:?db=nonsense", bytes(64)),
            }

        def redeem(db: str, text: str, proof: bytes) -> tuple[int, bytes, list[str]]:
            calls.clear()
            out = Client(stranger).request(str(node.peer_key.public), m.RedeemRequest(db, text, "read", proof))
            r = out.request
            resp = server.handle("POST", r.path, r.headers, r.body)
            return resp.status, resp.body, list(calls)

        for kind in ("its own ticket", "the real ticket without its secret", "garbage"):
            seen = {which: redeem(db, *requests(db)[kind]) for which, db in ids.items()}
            assert len(set(map(repr, seen.values()))) == 1, (kind, seen)
            status, _body, trace = seen["shared"]
            assert status == 404 and not any(c.startswith("sync.") or c.startswith("database") for c in trace), trace
            assert trace.count("decode") == 1 and trace.count("verify") == (0 if kind == "garbage" else 1), trace

        # The invite's holder gets past the proof, and only then is the id looked up.
        holder = _invite_key(real["ticket"])
        proof = holder.sign(DOMAIN_TICKET_REDEEM, m.redemption_message(shared, str(stranger.public), bare, "read"))
        status, body, trace = redeem(shared, bare, proof)
        assert status == 200, m.unpack(body)
        assert trace[:2] == ["decode", "verify"] and "sync.invite" in trace
    finally:
        node.close()


def test_an_invite_of_an_older_version_redeems_and_loses_its_grant(tmp_path):
    """An older version's invite (granted Read in the settings) still redeems, at its record,
    and the redemption entry revokes that grant with the importer's grant."""
    home = tmp_path / "a"
    _init(home, memories=0)
    key, ticket = _legacy_invite(home)
    with Node.open(home) as node:
        db = node.agents.resolve(BANK).db
        assert db.permission(str(key.public)) is not None
        t = decode(ticket)
        importer = SigningKey.generate()
        bare = encode(t.without_secret())
        proof = key.sign(DOMAIN_TICKET_REDEEM, m.redemption_message(db.id, str(importer.public), bare, "read"))
        entry = sharing.redeem(node, db.id, str(importer.public), bare, "read", proof)
        assert entry is not None
        assert db.permission(str(key.public)) is None and db.permission(str(importer.public)).level == "read"
        assert {r.value["key"] for r in db.rows("_settings") if r.entry_id == entry} == {
            str(key.public), str(importer.public)}  # one entry: the grant and the revocation
        assert json.loads(node.storage.get_local("sync-invites", str(key.public)))["used_by"] == str(importer.public)


def test_old_invite_grants_are_revoked_and_the_invite_still_redeems(tmp_path):
    home = tmp_path / "a"
    _init(home, memories=0)
    key, ticket = _legacy_invite(home)
    with Node.open(home) as node:
        db = node.agents.resolve(BANK).db
        assert sharing.revoke_old_invite_grants(node) == 1
        assert sharing.revoke_old_invite_grants(node) == 0  # idempotent: nothing more to write
        assert db.permission(str(key.public)) is None
        importer = SigningKey.generate()
        bare = encode(decode(ticket).without_secret())
        proof = key.sign(DOMAIN_TICKET_REDEEM, m.redemption_message(db.id, str(importer.public), bare, "read"))
        assert sharing.redeem(node, db.id, str(importer.public), bare, "read", proof) is not None
        assert db.permission(str(importer.public)).level == "read"
