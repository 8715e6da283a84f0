"""Sharing banks between peers with tickets: share, unshare, import, and redeeming invites.

The issuing node signs tickets with its peer key, which it makes an admin of the bank first
(the bank's own key, Admin(0), grants it Admin(1)); so a ticket's issuer is also the node to
reach, and LAN discovery can find it by that key when the address hint is stale.

* ``--for KEY``: the recipient's key is granted at once; the ticket names it.
* otherwise an invite: a fresh key, granted Read so its holder can be recognised, whose seed
  is the ticket's secret (in the fragment, never in the query). The importer redeems it at the
  issuing node, which checks expiry and single use and commits one settings entry granting
  the importer's own key (at most the ticket's permission) and revoking the invite key: the
  redemption is in the signed log and an invite works once.

An Admin given by a ticket is always weaker (a higher priority number) than its issuer.
Nothing is written on the importing node until the ticket, the requested permission and the
issuer's answer all check out.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import aiohttp

from auth.errors import MemmeshError
from auth.keys import DOMAIN_TICKET_REDEEM, PublicKey, SigningKey, verify
from auth.ops import GrantOp, RevokeOp
from auth.permissions import ADMIN, READ_LEVEL, WRITE, holds, rank
from crdt.database import Database
from node.memory.agents import WRITE_PRIORITY
from node.registry import BankRecord, NameTaken, check_name
from node.sync import messages as m
from node.sync.http import HttpTransport, call, run_exchange
from node.sync.protocol import Client, Exchange, SyncError
from node.sync.state import Invite, now_ms
from node.worker import Runner
from tickets import Ticket, TicketRejected, check, decode, encode, issue

if TYPE_CHECKING:
    from node.library import Node

PEER_KEY_NAME = "peer"  # node/home.py keeps the peer key in keys/peer.key
DEFAULT_TICKET_S = 7 * 24 * 3600
DEFAULT_ADDRESS = "http:127.0.0.1:7411"


class ShareError(MemmeshError):
    """A share or import that cannot be done as asked."""


def _perm_rank(perm: str) -> int:
    return {ADMIN: 0, WRITE: 1, READ_LEVEL: 2}[perm]


# ----------------------------------------------------------------------------- issuing
def ensure_peer_admin(node: "Node", bank_ref: str) -> tuple[Any, int]:
    """Make the node's peer key an admin of the bank (if it is not); returns (bank, priority)."""
    bank = node.agents.resolve(bank_ref)
    peer = str(node.peer_key.public)
    perm = bank.db.permission(peer)
    if perm is not None and perm.level == ADMIN:
        return bank, perm.priority or 0
    held = bank.db.permission(str(bank.admin_key.public))
    if bank.admin_key.public == node.peer_key.public or held is None or held.level != ADMIN:
        raise ShareError(f"this node holds no admin key for {bank.name}, so it cannot share it "
                         f"(it holds {perm.level if perm else 'no permission'}); ask an admin of the bank for a ticket "
                         "with --perm admin, or to share it")
    priority = (held.priority or 0) + 1
    bank.db.change_settings(bank.admin_key, [GrantOp(peer, ADMIN, priority)])
    return bank, priority


@dataclass(frozen=True)
class Shared:
    ticket: Ticket
    text: str  # the ticket to hand over (with its secret)
    bank: str
    db: str


def share(node: "Node", bank_ref: str, *, perm: str, recipient: str | None, expires_s: int,
          address: str) -> Shared:
    if expires_s <= 0:
        raise ShareError("a ticket must expire in the future (--expires takes a duration such as 7d, 12h or 30m)")
    bank, issuer_priority = ensure_peer_admin(node, bank_ref)
    priority = issuer_priority + 1 if perm == ADMIN else (WRITE_PRIORITY if perm == WRITE else None)
    if perm == WRITE and priority is not None and priority <= issuer_priority:
        priority = issuer_priority + 1
    expires = int(time.time()) + expires_s
    invite = None
    if recipient is not None:
        try:
            recipient = str(PublicKey.parse(recipient))
        except Exception:
            raise ShareError(f"--for takes a peer key (ed25519:...), got {recipient!r}") from None
        if recipient == str(node.peer_key.public):
            raise ShareError("--for names this node's own key")
    else:
        invite = SigningKey.generate()
    ticket = issue(node.peer_key, db=bank.db.id, addresses=[address], perm=perm, priority=priority,
                   recipient=recipient, invite=invite, expires=expires)
    # Grant first, then record: a failed grant leaves no ticket behind.
    if recipient is not None:
        current = bank.db.permission(recipient)
        if current is None or rank(current) > rank(ticket.permission):
            bank.db.change_settings(node.peer_key, [GrantOp(recipient, perm, priority)])
    else:
        assert invite is not None
        bank.db.change_settings(node.peer_key, [GrantOp(str(invite.public), READ_LEVEL, None)])
        node.sync.put_invite(str(invite.public), Invite(bank.db.id, perm, priority, expires, encode(ticket.without_secret())))
    node.sync.share(bank.db.id)
    return Shared(ticket, encode(ticket), bank.name, bank.db.id)


def unshare(node: "Node", bank_ref: str) -> tuple[str, bool]:
    bank = node.agents.resolve(bank_ref)
    return bank.name, node.sync.unshare(bank.db.id)


# ----------------------------------------------------------------------------- redeeming
def redeem(node: "Node", db_id: str, caller: str, text: str, perm: str, proof: bytes) -> str | None:
    """The issuing node's side of an invite (runs on the database thread)."""
    try:
        ticket = decode(text)
    except TicketRejected:
        return None
    if ticket.invite is None or ticket.db != db_id or ticket.issuer != str(node.peer_key.public):
        return None
    invite = node.sync.invite(ticket.invite)
    if invite is None or invite.db != db_id:
        return None
    if not verify(PublicKey.parse(ticket.invite).raw, DOMAIN_TICKET_REDEEM,
                  m.redemption_message(db_id, caller, text, perm), proof):
        return None
    # From here on the caller holds the invite's secret: it may learn why it is refused.
    if invite.used_by is not None:
        if invite.used_by == caller and invite.entry:
            return invite.entry  # the same importer again (its first try lost the answer)
        raise TicketRejected("ticket.used", "this invite was already used; ask the issuer for a new ticket")
    if int(time.time()) >= ticket.expires:
        raise TicketRejected("ticket.expired", "this ticket has expired; ask the issuer for a new ticket")
    if _perm_rank(perm) < _perm_rank(ticket.perm):
        raise TicketRejected("ticket.permission", f"this ticket gives at most {ticket.perm}, not {perm}")
    db = node.database(db_id)
    if not holds(db.permission(ticket.invite), READ_LEVEL):
        raise TicketRejected("ticket.used", "this invite is no longer valid in the bank's settings (revoked)")
    priority = ticket.priority if perm == ticket.perm else (WRITE_PRIORITY if perm == WRITE else None)
    if perm == ADMIN:
        priority = ticket.priority
    entry = db.change_settings(node.peer_key, [GrantOp(caller, perm, priority), RevokeOp(ticket.invite)])
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


def _check_import(node: "Node", text: str, perm: str, name: str | None) -> tuple[Ticket, str]:
    ticket = decode(text.strip())
    check(ticket, now=int(time.time()), importer=str(node.peer_key.public))
    if _perm_rank(perm) < _perm_rank(ticket.perm):
        raise TicketRejected("ticket.permission", f"this ticket gives at most {ticket.perm}; import it with "
                                                  f"{ticket.perm} or less")
    if ticket.recipient is not None and perm != ticket.perm:
        raise TicketRejected("ticket.permission", f"this ticket was made for this node with {ticket.perm}; "
                                                  f"import it with {ticket.perm}")
    rec = next((b for b in node.registry.banks() if b.db_id == ticket.db), None)
    if rec is not None:
        raise ShareError(f"this node already has that bank, as {rec.name}")
    return ticket, name


async def import_ticket(node: "Node", text: str, perm: str, name: str | None, run: Runner,
                        lookup: Callable[[str], list[str]] = lambda key: []) -> Imported:
    """Verify the ticket, reach its issuer, redeem (invite) and bootstrap; register the bank.

    The issuer is tried at the ticket's address hints, then at the addresses LAN discovery
    announces for its key (``lookup``): a discovered peer proves its key on first contact.
    """
    ticket, name = await run(lambda: _check_import(node, text, perm, name))
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
                        raise TicketRejected(exc.reason, str(exc)) from None
                    raise ShareError(f"the issuer at {address} did not accept the invite: {exc}") from None
            try:  # is the bank served to this node's key? Asked before anything is written here.
                await call(transport, client, address, ticket.issuer, m.FeedsRequest(ticket.db, {}, {}))
            except SyncError as exc:
                raise ShareError(f"the issuer at {address} does not serve this bank to this node: {exc}; "
                                 "nothing was written") from None
            db = await run(lambda: _open_empty(node, ticket.db))
            exchange = Exchange(db, ticket.issuer, push=False)
            try:
                await run_exchange(transport, client, address, ticket.issuer, exchange, run)
            except SyncError as exc:
                raise ShareError(f"could not copy the bank from {address}: {exc}; nothing was registered, "
                                 "run the import again") from None
            return await run(lambda: _register(node, ticket, perm, name, address, len(db)))
    raise ShareError("could not reach the ticket's issuer (" + "; ".join(errors) + "); check that its "
                     "`memmesh serve` runs, or ask for a ticket with a current address")


def _addresses(ticket: Ticket, lookup: Callable[[str], list[str]]):
    """The ticket's hints, then (only if those fail) what the LAN says about the issuer's key."""
    tried = []
    for address in ticket.addresses:
        tried.append(address)
        yield address
    for address in lookup(ticket.issuer):
        if address not in tried:
            tried.append(address)
            yield address


def _open_empty(node: "Node", db_id: str) -> Database:
    if db_id not in node.database_ids():
        node.storage.add_database(db_id)
    return node.database(db_id)


def _register(node: "Node", ticket: Ticket, perm: str, name: str | None, address: str, entries: int) -> Imported:
    db = node.database(ticket.db)
    if not db.is_accepted(ticket.db) or db.meta().get("kind") not in ("bank", "agent"):
        raise ShareError(f"the issuer at {address} did not send the bank {ticket.db}; nothing was registered")
    held = db.permission(str(node.peer_key.public))
    if held is None:
        raise ShareError("the bank's settings do not grant this node's key yet; nothing was registered; "
                         "run the import again in a moment")
    display = db.meta().get("display_name")
    name = name or (display if isinstance(display, str) else None)
    if name is None:
        raise ShareError("the bank has no name; give one with --name")
    check_name(name, "bank")
    taken = node.registry.name_taken(name)
    if taken:
        raise NameTaken(f"{name!r} is already {taken} on this node; import with --name OTHER")
    node.registry.add_bank(BankRecord(name, db.id, PEER_KEY_NAME, str(db.meta().get("description") or "")))
    node.sync.share(db.id)
    node.sync.peers.add(db.id, ticket.issuer, [address], "ticket", now_ms())
    node.sync.save_peers()
    return Imported(name, db.id, held.level, entries, ticket.issuer, address)
