"""Signed database tickets: one line of text that invites a peer to a database.

Pure: no sockets, no files, no clock (``check`` takes ``now`` as an argument).

A ticket is written (docs/protocol.md section 5)::

    memmesh:?db=<id>&pr=http:<host>:<port>[&pr=...]&perm=<level>[&prio=<n>]
            &(for|inv)=ed25519:<key>&exp=<seconds>&iss=ed25519:<key>&sig=<base64url>
            [#secret=<base64url seed>]

Each ticket has exactly one text form: ``decode`` parses strictly, rebuilds the text from what
it parsed and refuses (``ticket.format``) anything that is not byte for byte that text, then
checks the issuer's signature (domain ``ticket``) over the canonical msgpack of every field but
the signature and the secret. The invite secret travels only in the fragment (queries land in
logs) and must derive exactly the ``inv`` key.
"""
from __future__ import annotations

import binascii
import ipaddress
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Iterable  # noqa: UP035  (tickets/ may import typing, not collections: test_tickets_package_is_pure)

import msgpack

from memmesh.auth.b64url import b64url_decode, b64url_encode
from memmesh.auth.errors import KeyFormatError, RejectedError
from memmesh.auth.keys import DOMAIN_TICKET, PublicKey, SigningKey, verify
from memmesh.auth.permissions import ADMIN, LEVELS, MAX_PRIORITY, READ_LEVEL, Permission
from memmesh.crdt.entry import id_to_raw, raw_to_id
from memmesh.crdt.errors import EntryRejected

__all__ = [
    "Ticket", "TicketRejected", "Address", "issue", "encode", "decode", "verify_signature",
    "check", "parse_address", "MAX_TICKET_CHARS", "MAX_ADDRESSES", "MAX_EXPIRES", "SCHEME",
    "FORMAT", "SIZE", "FIELD", "SIGNATURE", "SECRET", "EXPIRED", "RECIPIENT",
]

SCHEME = "memmesh:"
MAX_TICKET_CHARS = 4096  # checked before any parsing
MAX_ADDRESSES = 8
MAX_EXPIRES = 2**53 - 1  # seconds since the epoch; a JavaScript-safe integer
SECRET_LEN = 32
SIGNATURE_CHARS = 86  # 64 bytes in base64url without padding
SECRET_CHARS = 43  # 32 bytes in base64url without padding

# Reason codes (stable: tests, logs and counters use them).
FORMAT = "ticket.format"  # not the one text form of a ticket: layout, order, spelling
SIZE = "ticket.size"  # longer than MAX_TICKET_CHARS
FIELD = "ticket.field"  # a field's value is not valid
SIGNATURE = "ticket.signature"  # the issuer's signature does not verify
SECRET = "ticket.secret"  # the invite secret is missing or does not derive the inv key
EXPIRED = "ticket.expired"  # now >= exp
RECIPIENT = "ticket.recipient"  # the ticket names another recipient key

# Every character a ticket may contain. No '%' (no percent-escapes), no '+', no spaces.
_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:[]?&=#")
_PARAMS = ("db", "pr", "perm", "prio", "for", "inv", "exp", "iss", "sig")
_ORDER_HINT = "db, pr (1 to 8 times), perm, prio (admin and write only), for or inv, exp, iss, sig"

_DECIMAL = re.compile(r"0|[1-9][0-9]{0,15}")
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_IPV4 = re.compile(r"[0-9.]{7,15}")
_IPV6 = re.compile(r"[0-9a-f:]{2,39}")


class TicketRejected(RejectedError):
    """A ticket that is refused; ``reason`` is one of the ``ticket.*`` codes above."""


def _reject(reason: str, detail: str) -> TicketRejected:
    return TicketRejected(reason, detail)


# ------------------------------------------------------------------------------ small parts
def _unb64(text: str, nbytes: int, what: str) -> bytes:
    """Canonical base64url without padding of exactly ``nbytes`` bytes, else ticket.field."""
    chars = (nbytes * 4 + 2) // 3
    hint = f"{what} is {nbytes} bytes in base64url without padding ({chars} characters)"
    if not isinstance(text, str) or len(text) != chars or not _B64URL.fullmatch(text):
        raise _reject(FIELD, f"{hint}; the ticket's value is not")
    try:
        raw = b64url_decode(text)
    except (binascii.Error, ValueError) as exc:
        raise _reject(FIELD, f"{hint}; the ticket's value is not") from exc
    if len(raw) != nbytes or b64url_encode(raw) != text:
        raise _reject(FIELD, f"{hint}, spelled canonically (unused bits zero); the ticket's value is not")
    return raw


def _key(text: object, what: str) -> str:
    """A public key in its one spelling ``ed25519:<43 base64url>``, else ticket.field."""
    try:
        key = PublicKey.parse(text)
    except KeyFormatError as exc:
        raise _reject(FIELD, f"{what} must be a public key 'ed25519:<43 base64url characters>': {exc}") from exc
    return str(key)


def _decimal(text: str, what: str, low: int, high: int) -> int:
    if not _DECIMAL.fullmatch(text) or not low <= int(text) <= high:
        raise _reject(FIELD, f"{what} is a decimal integer in {low}..{high} without leading zeros, "
                             f"got {text[:24]!r}")
    return int(text)


def _db(value: object) -> str:
    hint = "db must be a database id 'sha256:<64 lowercase hex digits>'"
    if not isinstance(value, str):
        raise _reject(FIELD, f"{hint}, got {value!r}")
    try:
        raw = id_to_raw(value)
    except EntryRejected as exc:
        raise _reject(FIELD, f"{hint}, got {value[:80]!r}") from exc
    if len(raw) != 32 or raw_to_id(raw) != value:  # id_to_raw alone takes upper case, spaces
        raise _reject(FIELD, f"{hint}, got {value[:80]!r}")
    return value


@dataclass(frozen=True, slots=True)
class Address:
    """One address hint: ``http:<host>:<port>``. ``host`` is as written (IPv6 in brackets)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"http:{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The URL a sync client connects to, e.g. ``http://[2001:db8::1]:7420``."""
        return f"http://{self.host}:{self.port}"


def _host(host: str) -> str:
    """Canonical host: IPv4 dotted quad, bracketed RFC 5952 IPv6, or a lowercase DNS name."""
    if host.startswith("["):
        inner = host[1:-1] if host.endswith("]") else ""
        if not _IPV6.fullmatch(inner):
            raise _reject(FIELD, f"an IPv6 host is '[<address>]' in lowercase hex, got {host[:60]!r}")
        try:
            addr = ipaddress.IPv6Address(inner)
        except ValueError as exc:
            raise _reject(FIELD, f"not an IPv6 address: {host[:60]!r}") from exc
        if addr.ipv4_mapped is not None:
            raise _reject(FIELD, f"write the IPv4-mapped address {host!r} as the IPv4 address "
                                 f"{addr.ipv4_mapped}")
        if str(addr) != inner:
            raise _reject(FIELD, f"write the IPv6 address {host!r} in its RFC 5952 form [{addr}]")
        return host
    labels = host.split(".")
    if labels[-1][:1].isdigit():  # a numeric last label: the host must be an IPv4 address
        if not _IPV4.fullmatch(host):
            raise _reject(FIELD, f"not an IPv4 address: {host[:60]!r}")
        try:
            addr4 = ipaddress.IPv4Address(host)
        except ValueError as exc:
            raise _reject(FIELD, f"an IPv4 host is four decimal numbers 0..255 without leading "
                                 f"zeros, got {host[:60]!r}") from exc
        if str(addr4) != host:
            raise _reject(FIELD, f"write the IPv4 address {host!r} as {addr4}")
        return host
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise _reject(FIELD, "a host name is at most 253 characters of dot-separated labels "
                             "(1..63 of a-z 0-9 -, not starting or ending with -), in lower case, "
                             f"without a trailing dot, got {host[:60]!r}")
    return host


def parse_address(text: object) -> Address:
    """Parse one address hint ``http:<host>:<port>`` in its one canonical spelling."""
    if not isinstance(text, str) or not text.startswith("http:"):
        raise _reject(FIELD, f"an address hint looks like 'http:<host>:<port>', got {str(text)[:60]!r}")
    host, sep, port = text[5:].rpartition(":")
    if not sep or not host:
        raise _reject(FIELD, f"an address hint looks like 'http:<host>:<port>', got {text[:60]!r}")
    return Address(_host(host), _decimal(port, "a port", 1, 65535))


def _address(value: object) -> str:
    return str(parse_address(str(value) if isinstance(value, Address) else value))


# -------------------------------------------------------------------------------- the ticket
@dataclass(frozen=True)
class Ticket:
    """A ticket's fields. Constructing one checks every field (``ticket.field``) and that the
    secret, if any, derives the invite key (``ticket.secret``); the signature is checked by
    ``decode``, ``verify_signature`` and ``check``.

    ``str(ticket)`` and ``repr(ticket)`` never show the secret; ``encode(ticket)`` does.
    """

    db: str
    addresses: tuple[str, ...]
    perm: str
    priority: int | None
    recipient: str | None  # `for`: the importer's own key, pre-authorised by the issuer
    invite: str | None  # `inv`: the public key of a single-use invite
    expires: int  # `exp`: seconds since the epoch; valid while now < expires
    issuer: str  # `iss`
    signature: bytes = field(repr=False)  # `sig`: 64 bytes
    secret: bytes | None = field(default=None, repr=False)  # the invite seed (32 bytes)

    def __post_init__(self) -> None:
        _db(self.db)
        if not isinstance(self.addresses, tuple):
            raise _reject(FIELD, "addresses is a tuple of 'http:<host>:<port>' strings")
        if not 1 <= len(self.addresses) <= MAX_ADDRESSES:
            raise _reject(FIELD, f"a ticket carries 1 to {MAX_ADDRESSES} address hints (pr=), "
                                 f"got {len(self.addresses)}")
        for a in self.addresses:
            if not isinstance(a, str) or _address(a) != a:
                raise _reject(FIELD, f"address hints are canonical 'http:<host>:<port>' strings, got {a!r}")
        if len(set(self.addresses)) != len(self.addresses):
            raise _reject(FIELD, "the same address hint (pr=) appears twice")
        if self.perm not in LEVELS:
            raise _reject(FIELD, f"perm is one of admin, write, read, got {str(self.perm)[:20]!r}")
        if self.perm == READ_LEVEL:
            if self.priority is not None:
                raise _reject(FIELD, "a read ticket carries no priority (prio=)")
        else:
            if type(self.priority) is not int or not 0 <= self.priority <= MAX_PRIORITY:
                raise _reject(FIELD, f"an {self.perm} ticket carries a priority (prio=) in "
                                     f"0..{MAX_PRIORITY}, got {self.priority!r}")
            if self.perm == ADMIN and self.priority == 0:
                raise _reject(FIELD, "an admin ticket's priority is at least 1: the admin it gives "
                                     "must be weaker (a higher number) than its issuer")
        if (self.recipient is None) == (self.invite is None):
            raise _reject(FIELD, "a ticket carries exactly one of a recipient key (for=) and an "
                                 "invite key (inv=)")
        if self.recipient is not None and _key(self.recipient, "for") != self.recipient:
            raise _reject(FIELD, "for must be a public key in its canonical spelling")
        if self.invite is not None and _key(self.invite, "inv") != self.invite:
            raise _reject(FIELD, "inv must be a public key in its canonical spelling")
        if type(self.expires) is not int or not 0 <= self.expires <= MAX_EXPIRES:
            raise _reject(FIELD, f"exp is seconds since the epoch in 0..{MAX_EXPIRES}, got {self.expires!r}")
        if _key(self.issuer, "iss") != self.issuer:
            raise _reject(FIELD, "iss must be a public key in its canonical spelling")
        if not isinstance(self.signature, bytes) or len(self.signature) != 64:
            raise _reject(FIELD, "sig is a 64-byte Ed25519 signature")
        if self.secret is not None:
            if self.invite is None:
                raise _reject(FIELD, "only an invite ticket (inv=) carries a secret")
            if not isinstance(self.secret, bytes) or len(self.secret) != SECRET_LEN:
                raise _reject(SECRET, f"an invite secret is a {SECRET_LEN}-byte Ed25519 seed")
            if str(SigningKey.from_seed(self.secret).public) != self.invite:
                raise _reject(SECRET, "the ticket's secret (after '#secret=') is not the invite "
                                      "key's seed: the ticket was altered or truncated; copy the "
                                      "whole ticket again")

    @property
    def permission(self) -> Permission:
        return Permission(self.perm, self.priority)

    def signed_bytes(self) -> bytes:
        """The canonical msgpack the issuer signs (docs/protocol.md section 5.2)."""
        body: dict[str, object] = {
            "db": id_to_raw(self.db),
            "pr": list(self.addresses),
            "perm": self.perm,
        }
        if self.priority is not None:
            body["prio"] = self.priority
        if self.recipient is not None:
            body["for"] = PublicKey.parse(self.recipient).raw
        else:
            body["inv"] = PublicKey.parse(self.invite).raw
        body["exp"] = self.expires
        body["iss"] = PublicKey.parse(self.issuer).raw
        packed: bytes = msgpack.packb(body, use_bin_type=True)
        return packed

    def without_secret(self) -> Ticket:
        """The same signed ticket without the invite secret (it still decodes, cannot redeem)."""
        return replace(self, secret=None)

    def redacted(self) -> str:
        """The ticket's text without the secret: safe for logs and status output."""
        return encode(self.without_secret()) + ("#secret=<redacted>" if self.secret is not None else "")

    def invite_key(self) -> SigningKey | None:
        """The single-use invite key (from the secret), or None if the ticket carries none."""
        return None if self.secret is None else SigningKey.from_seed(self.secret)

    def __str__(self) -> str:
        return self.redacted()


def issue(
    issuer: SigningKey,
    *,
    db: str,
    addresses: Iterable[str | Address],
    perm: str,
    priority: int | None,
    recipient: str | PublicKey | None = None,
    invite: SigningKey | None = None,
    expires: int,
) -> Ticket:
    """Sign a ticket. Give exactly one of ``recipient`` (the importer's public key) and
    ``invite`` (a fresh key whose seed becomes the ticket's secret). Bad fields raise
    TicketRejected (``ticket.field``)."""
    if not isinstance(issuer, SigningKey):
        raise TypeError("issuer is a SigningKey")
    if invite is not None and not isinstance(invite, SigningKey):
        raise TypeError("invite is a SigningKey (its seed becomes the ticket's secret)")
    if isinstance(addresses, (str, Address)):
        addresses = [addresses]
    unsigned = Ticket(
        db=db,
        addresses=tuple(_address(a) for a in addresses),
        perm=perm,
        priority=priority,
        recipient=None if recipient is None else str(recipient),
        invite=None if invite is None else str(invite.public),
        expires=expires,
        issuer=str(issuer.public),
        signature=bytes(64),
        secret=None if invite is None else invite.seed(),
    )
    return replace(unsigned, signature=issuer.sign(DOMAIN_TICKET, unsigned.signed_bytes()))


def encode(ticket: Ticket) -> str:
    """The ticket's one text form, with ``#secret=`` when it carries the invite secret."""
    parts = [f"db={ticket.db}"]
    parts += [f"pr={a}" for a in ticket.addresses]
    parts.append(f"perm={ticket.perm}")
    if ticket.priority is not None:
        parts.append(f"prio={ticket.priority}")
    if ticket.recipient is not None:
        parts.append(f"for={ticket.recipient}")
    else:
        parts.append(f"inv={ticket.invite}")
    parts += [f"exp={ticket.expires}", f"iss={ticket.issuer}", f"sig={b64url_encode(ticket.signature)}"]
    text = SCHEME + "?" + "&".join(parts)
    if ticket.secret is not None:
        text += "#secret=" + b64url_encode(ticket.secret)
    return text


def verify_signature(ticket: Ticket) -> None:
    """Raise ``ticket.signature`` unless the issuer signed exactly these fields."""
    if not verify(PublicKey.parse(ticket.issuer).raw, DOMAIN_TICKET, ticket.signed_bytes(),
                  ticket.signature):
        raise _reject(SIGNATURE, f"the signature does not verify for the issuer {ticket.issuer}: "
                                 "the ticket was altered or not signed by that key; ask the issuer "
                                 "for a new ticket and copy it whole")


def _expected_names(perm: str, who: str, count_pr: int) -> list[str]:
    names = ["db"] + ["pr"] * count_pr + ["perm"]
    if perm != READ_LEVEL:
        names.append("prio")
    return names + [who, "exp", "iss", "sig"]


def decode(text: object) -> Ticket:
    """Parse a ticket's text strictly and check its signature (not its expiry: see ``check``).

    Raises TicketRejected: ``ticket.size``, ``ticket.format``, ``ticket.field``,
    ``ticket.signature`` or ``ticket.secret``.
    """
    if not isinstance(text, str):
        raise _reject(FORMAT, f"a ticket is text, got {type(text).__name__}")
    if len(text) > MAX_TICKET_CHARS:
        raise _reject(SIZE, f"a ticket is at most {MAX_TICKET_CHARS} characters, got {len(text)}")
    for i, ch in enumerate(text):
        if ch not in _ALPHABET:
            what = "a non-ASCII character" if ord(ch) > 127 else f"the character {ch!r}"
            raise _reject(FORMAT, f"{what} at position {i} is not part of any ticket (tickets use "
                                  "A-Z a-z 0-9 - _ . : [ ] ? & = # and no spaces or %-escapes); "
                                  "copy the ticket again exactly")
    if not text.startswith(SCHEME + "?"):
        raise _reject(FORMAT, "a ticket starts with 'memmesh:?'")
    query, hash_, fragment = text[len(SCHEME) + 1:].partition("#")
    params: list[tuple[str, str]] = []
    for part in query.split("&"):
        name, eq, value = part.partition("=")
        if name not in _PARAMS:
            raise _reject(FORMAT, f"unknown ticket parameter {name[:16]!r}; a ticket has exactly "
                                  f"{_ORDER_HINT}")
        if not eq or not value:
            raise _reject(FORMAT, f"the ticket parameter {name!r} is empty")
        params.append((name, value))
    names = [n for n, _ in params]
    values: dict[str, str] = {}
    for n, v in params:
        if n != "pr" and n in values:
            raise _reject(FORMAT, f"the ticket parameter {n!r} appears twice")
        values.setdefault(n, v)
    if ("for" in values) == ("inv" in values):
        raise _reject(FORMAT, "a ticket carries exactly one of for= (a recipient key) and inv= "
                              "(an invite key)")
    perm = values.get("perm", "")
    if perm not in LEVELS:
        raise _reject(FIELD, f"perm is one of admin, write, read, got {perm[:20]!r}")
    who = "for" if "for" in values else "inv"
    if names != _expected_names(perm, who, names.count("pr")):
        raise _reject(FORMAT, f"the ticket's parameters must be, in this order: {_ORDER_HINT}")
    secret = None
    if hash_:
        if who != "inv":
            raise _reject(FORMAT, "only an invite ticket (inv=) carries '#secret='")
        if not fragment.startswith("secret="):
            raise _reject(FORMAT, "the part after '#' is 'secret=<invite secret>'")
        secret = _unb64(fragment[len("secret="):], SECRET_LEN, "the invite secret")
    ticket = Ticket(
        db=_db(values["db"]),
        addresses=tuple(v for n, v in params if n == "pr"),
        perm=perm,
        priority=None if perm == READ_LEVEL else _decimal(values["prio"], "prio", 0, MAX_PRIORITY),
        recipient=_key(values["for"], "for") if who == "for" else None,
        invite=_key(values["inv"], "inv") if who == "inv" else None,
        expires=_decimal(values["exp"], "exp", 0, MAX_EXPIRES),
        issuer=_key(values["iss"], "iss"),
        signature=_unb64(values["sig"], 64, "sig"),
        secret=secret,
    )
    if encode(ticket) != text:  # the one text form, byte for byte
        raise _reject(FORMAT, "the ticket is not in its canonical form; copy it again exactly")
    verify_signature(ticket)
    return ticket


def _when(seconds: int) -> str:
    try:
        stamp = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return f"{seconds} s after the epoch"
    return f"{stamp} ({seconds})"


def check(ticket: Ticket, *, now: int, importer: str | PublicKey | None = None) -> None:
    """May ``importer`` import this ticket at time ``now`` (seconds since the epoch)?

    Checks the signature, the expiry (valid while ``now < expires``), the recipient (a ``for``
    ticket must name ``importer``) and that an invite ticket carries its secret. Whether the
    issuer is an admin of the database, and whether the invite is unused, is for the database
    to decide. Raises TicketRejected (``ticket.signature``, ``ticket.expired``,
    ``ticket.recipient``, ``ticket.secret``).
    """
    if type(now) is not int:
        raise TypeError("now is an int: seconds since the epoch")
    verify_signature(ticket)
    if now >= ticket.expires:
        raise _reject(EXPIRED, f"this ticket expired at {_when(ticket.expires)}; it is now "
                               f"{_when(now)}; ask the issuer for a new ticket")
    if ticket.recipient is not None:
        if importer is None:
            raise _reject(RECIPIENT, f"this ticket is for the key {ticket.recipient}; import it "
                                     "with that key")
        if str(importer) != ticket.recipient:
            raise _reject(RECIPIENT, f"this ticket is for the key {ticket.recipient}, not for "
                                     f"{importer}; ask the issuer for a ticket for your key")
    if ticket.invite is not None and ticket.secret is None:
        raise _reject(SECRET, "this invite ticket lacks its secret (the part after '#secret='); "
                              "copy the whole ticket, including what follows '#'")
