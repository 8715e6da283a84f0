"""Sharing banks between peers with tickets: share, unshare, import, and redeeming invites.

The issuing node signs tickets with its peer key, which it makes an admin of the bank first
(the bank's own key, Admin(0), grants it Admin(1)); so a ticket's issuer is also the node to
reach, and LAN discovery can find it by that key when the address hint is stale.

* ``--for KEY``: the recipient's key is granted at once; the ticket names it.
* otherwise an invite: a fresh key whose seed is the ticket's secret (in the fragment, never
  in the query). The invite key is granted NOTHING in the bank's settings: settings replicate
  to every holder of the bank and know no clock, so a grant there would let the key pull the
  bank from any node, before and after its expiry. The invite lives only in the issuing node's
  local invite record (node/sync/state.py), which alone can say whether it is unused, unended
  and unexpired. The importer redeems it at the issuing node, which checks that record and
  commits one settings entry granting the importer's own key (at most the ticket's
  permission): the redemption is in the signed log and an invite works once. An invite key can
  do nothing but that: this node never serves a database to it nor pushes to it.
* ``unshare`` and deleting a bank end its outstanding invites (``end_invites``).

Invites of older versions did grant the invite key Read: every write here that touches a bank's
invites (share, redeem, unshare, delete) revokes such grants in the same or one more entry, and
``readers.refusal`` keeps this node from serving or pushing to those keys meanwhile.

An Admin given by a ticket is always weaker (a higher priority number) than its issuer.
Every input of a share is checked before anything is written. Nothing is written on the
importing node until the ticket, the requested permission, the name, the issuer's answer and
the copied bank all check out: the bank is copied into memory first, then stored at once.
"""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memmesh.auth.errors import MemmeshError
from memmesh.auth.keys import DOMAIN_TICKET_REDEEM, PublicKey, SigningKey, verify
from memmesh.auth.ops import GrantOp, RevokeOp
from memmesh.auth.permissions import ADMIN, LEVELS, READ_LEVEL, WRITE, rank
from memmesh.crdt.clock import now_ms
from memmesh.crdt.database import Database
from memmesh.crdt.storage import MemoryStorage
from memmesh.node.memory.agents import WRITE_PRIORITY
from memmesh.node.registry import BankRecord, NameTaken, check_name
from memmesh.node.sync import messages as m
from memmesh.node.sync.protocol import Client, Exchange, SyncError
from memmesh.node.sync.state import Invite
from memmesh.node.worker import Runner
from memmesh.tickets import Ticket, TicketRejected, check, decode, encode, issue, parse_address

if TYPE_CHECKING:
    from memmesh.node.library import Node

log = logging.getLogger("memmesh.sync")
PEER_KEY_NAME = "peer"  # node/home.py keeps the peer key in keys/peer.key
DEFAULT_TICKET_S = 7 * 24 * 3600
DEFAULT_ADDRESS = "http:127.0.0.1:7411"
ENDED = "ticket.ended"  # the issuer ended the invite (unshare, delete) before it was redeemed


class ShareError(MemmeshError):
    """A share or import that cannot be done as asked."""


def _perm_rank(perm: str) -> int:
    return {ADMIN: 0, WRITE: 1, READ_LEVEL: 2}[perm]


# ----------------------------------------------------------------------------- issuing
def _peer_admin_plan(node: Node, bank: Any) -> tuple[int, list[GrantOp]]:
    """The admin priority the node's peer key holds, or would hold, on the bank, and the grant
    that makes it an admin (none if it is one): nothing is written here."""
    peer = str(node.peer_key.public)
    perm = bank.db.permission(peer)
    if perm is not None and perm.level == ADMIN:
        return perm.priority or 0, []
    held = bank.db.permission(str(bank.admin_key.public))
    if bank.admin_key.public == node.peer_key.public or held is None or held.level != ADMIN:
        raise ShareError(f"this node holds no admin key for {bank.name}, so it cannot share it "
                         f"(it holds {perm.level if perm else 'no permission'}); ask an admin of the bank for a ticket "
                         "with --perm admin, or to share it")
    priority = (held.priority or 0) + 1
    return priority, [GrantOp(peer, ADMIN, priority)]


def ensure_peer_admin(node: Node, bank_ref: str) -> tuple[Any, int]:
    """Make the node's peer key an admin of the bank (if it is not); returns (bank, priority)."""
    bank = node.agents.resolve(bank_ref)
    priority, ops = _peer_admin_plan(node, bank)
    if ops:
        bank.db.change_settings(bank.admin_key, ops)
    return bank, priority


@dataclass(frozen=True)
class Shared:
    ticket: Ticket
    text: str  # the ticket to hand over (with its secret)
    bank: str
    db: str


def share(node: Node, bank_ref: str, *, perm: str, recipient: str | None, expires_s: int,
          address: str) -> Shared:
    # Every input is checked, and the ticket signed, before the first write: a refused share
    # leaves the bank's settings as they were.
    if expires_s <= 0:
        raise ShareError("a ticket must expire in the future (--expires takes a duration such as 7d, 12h or 30m)")
    if perm not in LEVELS:
        raise ShareError(f"--perm is admin, write or read, got {perm!r}")
    bank = node.agents.resolve(bank_ref)
    if recipient is not None:
        try:
            recipient = str(PublicKey.parse(recipient))
        except Exception:
            raise ShareError(f"--for takes a peer key (ed25519:...), got {recipient!r}") from None
        if recipient == str(node.peer_key.public):
            raise ShareError("--for names this node's own key")
        if node.sync.is_invite(recipient):
            raise ShareError("--for names an invite key of this node, which may only redeem its invite; "
                             "give the importing node's peer key")
    try:
        address = str(parse_address(address))
    except TicketRejected as exc:
        raise ShareError(f"this node's advertised address {address!r} cannot go in a ticket: {exc}; "
                         "set it with serve --advertise http:HOST:PORT") from None
    issuer_priority, admin_ops = _peer_admin_plan(node, bank)
    priority = issuer_priority + 1 if perm == ADMIN else (WRITE_PRIORITY if perm == WRITE else None)
    if perm == WRITE and priority is not None and priority <= issuer_priority:
        priority = issuer_priority + 1
    expires = int(time.time()) + expires_s
    invite = None if recipient is not None else SigningKey.generate()
    ticket = issue(node.peer_key, db=bank.db.id, addresses=[address], perm=perm, priority=priority,
                   recipient=recipient, invite=invite, expires=expires)
    if admin_ops:
        bank.db.change_settings(bank.admin_key, admin_ops)
    if recipient is not None:
        current = bank.db.permission(recipient)
        if current is None or rank(current) > rank(ticket.permission):
            bank.db.change_settings(node.peer_key, [GrantOp(recipient, perm, priority)])
    else:
        assert invite is not None
        node.sync.put_invite(str(invite.public), Invite(bank.db.id, perm, priority, expires,
                                                        encode(ticket.without_secret())))
    _revoke_invite_grants(node, bank.db)
    node.sync.share(bank.db.id)
    return Shared(ticket, encode(ticket), bank.name, bank.db.id)


@dataclass(frozen=True)
class Unshared:
    bank: str
    db: str
    was_shared: bool
    invites_ended: int  # outstanding invites (unused, unexpired) ended by this unshare


def unshare(node: Node, bank_ref: str) -> Unshared:
    bank = node.agents.resolve(bank_ref)
    ended = end_invites(node, bank.db.id, "unshared")
    return Unshared(bank.name, bank.db.id, node.sync.unshare(bank.db.id), ended)


def end_invites(node: Node, db_id: str, why: str) -> int:
    """End every invite of ``db_id`` not yet redeemed (``why``: "unshared", "deleted"): none of
    them redeems afterwards, even if the bank is shared again. Returns how many were still
    outstanding (unexpired). Idempotent."""
    now_s = int(time.time())
    ended = 0
    for key, invite in node.sync.invites(db_id):
        if invite.used_by is None and invite.ended is None:
            ended += int(invite.outstanding(now_s))
            invite.ended = why
            node.sync.put_invite(key, invite)
    if db_id in node.database_ids():
        _revoke_invite_grants(node, node.database(db_id))
    return ended


def revoke_old_invite_grants(node: Node) -> int:
    """Revoke the Read grants older versions gave this node's invite keys, in every bank it
    holds (one settings entry per bank that has any); how many keys. For serve's start: this
    node never serves those keys, but other replicas do until the revocation reaches them."""
    revoked = 0
    for db_id in sorted({invite.db for _key, invite in node.sync.invites()}):
        if db_id in node.database_ids():
            revoked += _revoke_invite_grants(node, node.database(db_id))
    return revoked


def _invite_grant_revocations(node: Node, db: Database) -> list[RevokeOp]:
    """Revocations of the grants an older version gave this node's invite keys on ``db``."""
    return [RevokeOp(key) for key, _invite in node.sync.invites(db.id) if db.permission(key) is not None]


def _revoke_invite_grants(node: Node, db: Database) -> int:
    """One settings entry revoking those grants, if any; how many keys it revoked."""
    ops = _invite_grant_revocations(node, db)
    if not ops:
        return 0
    try:
        db.change_settings(node.peer_key, ops)
    except MemmeshError as exc:  # the peer key lost its admin: this node still never serves them
        log.warning("could not revoke %d invite key(s) an older version granted on %s: %s", len(ops), db.id, exc)
        return 0
    return len(ops)


# ----------------------------------------------------------------------------- redeeming
def _proven(node: Node, db_id: str, caller: str, text: str, perm: str, proof: bytes) -> Ticket | None:
    """The ticket if the request proves that its caller holds the secret of an invite this node
    signed for ``db_id``, else None. The work done here depends on the request alone, never on
    what this node holds: a stranger cannot tell a shared id from another by timing it."""
    try:
        ticket = decode(text)  # also verifies the issuer's signature
    except TicketRejected:
        return None
    if ticket.invite is None:
        return None
    proven = verify(PublicKey.parse(ticket.invite).raw, DOMAIN_TICKET_REDEEM,
                    m.redemption_message(db_id, caller, text, perm), proof)
    if not proven or ticket.db != db_id or ticket.issuer != str(node.peer_key.public):
        return None
    return ticket


def redeem(node: Node, db_id: str, caller: str, text: str, perm: str, proof: bytes) -> str | None:
    """The issuing node's side of an invite (runs on the database thread): the settings entry
    that grants ``caller``; None (answered like an unknown database) unless the caller proves
    it holds an invite this node issued for ``db_id``; TicketRejected after that."""
    ticket = _proven(node, db_id, caller, text, perm, proof)
    if ticket is None or ticket.invite is None:
        return None
    invite = node.sync.invite(ticket.invite)
    if invite is None or invite.db != db_id:
        return None
    # From here on the caller holds the invite's secret: it may learn why it is refused.
    if invite.used_by is not None:
        if invite.used_by == caller and invite.entry:
            return invite.entry  # the same importer again (its first try lost the answer)
        raise TicketRejected("ticket.used", "this invite was already used; ask the issuer for a new ticket")
    if invite.ended is not None:
        why = {"unshared": "when the bank was unshared", "deleted": "when the bank was deleted"}.get(
            invite.ended, f"({invite.ended})")
        raise TicketRejected(ENDED, f"the issuer ended this invite {why}; ask the issuer for a new ticket")
    if int(time.time()) >= min(ticket.expires, invite.expires):
        raise TicketRejected("ticket.expired", "this ticket has expired; ask the issuer for a new ticket")
    if caller == str(node.peer_key.public) or node.sync.is_invite(caller):
        raise TicketRejected("ticket.recipient", "an invite is redeemed for the importing node's own peer key, "
                                                 "not for the issuer's key or an invite key")
    if _perm_rank(perm) < _perm_rank(ticket.perm):
        raise TicketRejected("ticket.permission", f"this ticket gives at most {ticket.perm}, not {perm}")
    if not node.sync.is_shared(db_id) or db_id not in node.database_ids():
        # An invite outstanding on an unshared or deleted bank (only an older version left one): it ends.
        invite.ended = "unshared" if db_id in node.database_ids() else "deleted"
        node.sync.put_invite(ticket.invite, invite)
        raise TicketRejected(ENDED, "the issuer no longer shares this bank, which ended this invite; "
                                    "ask the issuer for a new ticket")
    db = node.database(db_id)
    priority = ticket.priority if perm == ticket.perm else (WRITE_PRIORITY if perm == WRITE else None)
    if perm == ADMIN:
        priority = ticket.priority
    entry = db.change_settings(node.peer_key, [GrantOp(caller, perm, priority), *_invite_grant_revocations(node, db)])
    invite.used_by, invite.entry = caller, entry
    node.sync.put_invite(ticket.invite, invite)
    return entry


# ----------------------------------------------------------------------------- importing
@dataclass(frozen=True)
class Imported:
    name: str
    db: str
    perm: str
    entries: int
    peer: str
    address: str


def _check_import(node: Node, text: str, perm: str, name: str | None,
                  clock: Callable[[], float]) -> tuple[Ticket, str | None]:
    ticket = decode(text.strip())
    check(ticket, now=int(clock()), importer=str(node.peer_key.public))
    if _perm_rank(perm) < _perm_rank(ticket.perm):
        raise TicketRejected("ticket.permission", f"this ticket gives at most {ticket.perm}; import it with "
                                                  f"{ticket.perm} or less")
    if ticket.recipient is not None and perm != ticket.perm:
        raise TicketRejected("ticket.permission", f"this ticket was made for this node with {ticket.perm}; "
                                                  f"import it with {ticket.perm}")
    rec = next((b for b in node.registry.banks() if b.db_id == ticket.db), None)
    if rec is not None:
        raise ShareError(f"this node already has that bank, as {rec.name}")
    if name is not None:  # before the invite is redeemed: a name taken here must not spend it
        _name_free(node, name)
    return ticket, name


def _name_free(node: Node, name: str) -> None:
    check_name(name, "bank")
    taken = node.registry.name_taken(name)
    if taken:
        raise NameTaken(f"{name!r} is already {taken} on this node; import with --name OTHER; nothing was written")


async def import_ticket(node: Node, text: str, perm: str, name: str | None, run: Runner,
                        lookup: Callable[[str], list[str]] = lambda key: [],
                        clock: Callable[[], float] = time.time) -> Imported:
    """Verify the ticket, reach its issuer, redeem (invite), copy the bank; store and register it.

    The issuer is tried at the ticket's address hints, then at the addresses LAN discovery
    announces for its key (``lookup``): a discovered peer proves its key on first contact.
    The bank is copied into memory and written here only once it checks out, so a refused or
    failed import leaves nothing on this node. ``clock``: seconds since the epoch, what the
    ticket's expiry is checked against.
    """
    # Imported here, not with the module: whatever loads the sync commands imports this module,
    # and only an import reaches a peer; aiohttp (with its TLS contexts) costs ~0.2 s to import.
    import aiohttp

    from memmesh.node.sync.http import HttpTransport, call, run_exchange

    ticket, name = await run(lambda: _check_import(node, text, perm, name, clock))
    client = Client(node.peer_key)
    errors = []
    async with aiohttp.ClientSession() as session:
        transport = HttpTransport(session)
        for address in _addresses(ticket, lookup):
            try:
                await call(transport, client, address, ticket.issuer, m.Hello())
            except SyncError as exc:
                errors.append(f"{address}: {exc}")
                continue
            if ticket.invite is not None:
                invite_key = ticket.invite_key()
                assert invite_key is not None
                bare = encode(ticket.without_secret())
                proof = invite_key.sign(DOMAIN_TICKET_REDEEM,
                                        m.redemption_message(ticket.db, str(node.peer_key.public), bare, perm))
                try:
                    await call(transport, client, address, ticket.issuer, m.RedeemRequest(ticket.db, bare, perm, proof))
                except SyncError as exc:
                    if exc.reason.startswith("ticket."):
                        raise TicketRejected(exc.reason, f"{exc}; nothing was written") from None
                    raise ShareError(f"the issuer at {address} did not accept the invite: {exc}; "
                                     "nothing was written") from None
            try:  # is the bank served to this node's key? Asked before anything is copied.
                await call(transport, client, address, ticket.issuer, m.FeedsRequest(ticket.db, {}, {}))
            except SyncError as exc:
                raise ShareError(f"the issuer at {address} does not serve this bank to this node: {exc}; "
                                 "nothing was written") from None
            staging = await run(lambda: _staging(ticket.db))
            exchange = Exchange(staging, ticket.issuer, push=False, pull_ahead=True)
            try:
                await run_exchange(transport, client, address, ticket.issuer, exchange, run)
            except SyncError as exc:
                raise ShareError(f"could not copy the bank from {address}: {exc}; nothing was written, "
                                 "run the import again") from None
            return await run(functools.partial(_register, node, ticket, perm, name, address, staging))
    raise ShareError("could not reach the ticket's issuer (" + "; ".join(errors) + "); check that its "
                     "`memmesh serve` runs, or ask for a ticket with a current address")


def _addresses(ticket: Ticket, lookup: Callable[[str], list[str]]) -> Iterator[str]:
    """The ticket's hints, then (only if those fail) what the LAN says about the issuer's key."""
    tried = []
    for address in ticket.addresses:
        tried.append(address)
        yield address
    for address in lookup(ticket.issuer):
        if address not in tried:
            tried.append(address)
            yield address


def _staging(db_id: str) -> Database:
    """An empty database in memory: the bank is copied here, checked, then stored at once."""
    storage = MemoryStorage()
    storage.add_database(db_id)
    return Database.open(storage, db_id)


def _register(node: Node, ticket: Ticket, perm: str, name: str | None, address: str,
              staging: Database) -> Imported:
    """Check the copied bank and its name, then store and register it (the first write here)."""
    if not staging.is_accepted(ticket.db) or staging.meta().get("kind") not in ("bank", "agent"):
        raise ShareError(f"the issuer at {address} did not send the bank {ticket.db}; nothing was written")
    held = staging.permission(str(node.peer_key.public))
    if held is None:
        raise ShareError("the bank's settings do not grant this node's key yet; nothing was written; "
                         "run the import again in a moment")
    display = staging.meta().get("display_name")
    name = name or (display if isinstance(display, str) else None)
    if name is None:
        raise ShareError("the bank has no name; give one with --name; nothing was written")
    try:
        _name_free(node, name)
    except NameTaken as exc:
        # Known only now (the name is the bank's own); the issuer keeps this node's redemption,
        # so the same ticket imports on this node again, e.g. with --name.
        raise NameTaken(f"{exc} (the ticket still imports on this node)") from None
    if any(b.db_id == ticket.db for b in node.registry.banks()):
        raise ShareError("this node already has that bank (imported meanwhile); nothing was written")
    db = _store(node, ticket.db, staging, f"peer:{ticket.issuer}")
    node.registry.add_bank(BankRecord(name, db.id, PEER_KEY_NAME, str(db.meta().get("description") or "")))
    node.sync.share(db.id)
    node.sync.peers.add(db.id, ticket.issuer, [address], "ticket", now_ms())
    node.sync.save_peers()
    return Imported(name, db.id, held.level, len(db), ticket.issuer, address)


def _store(node: Node, db_id: str, staging: Database, source: str) -> Database:
    """The staged entries into this node's storage: a new database in one transaction (each
    passed the whole pipeline in staging, as on a restart nothing is verified twice), which the
    node then holds as staging built it (``Home.adopt``: reading the log back would hash and
    index every entry again); a database kept here already (an archived bank) takes them
    through ingest."""
    entries = staging.storage.entries(db_id)
    if db_id in node.database_ids():
        db = node.database(db_id)
        db.ingest([(e.header, dict(e.payloads)) for e in entries], source=source)
        return db
    node.storage.add_database(db_id)
    node.storage.append(db_id, entries)
    return node.adopt(staging)
