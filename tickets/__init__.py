"""Signed database tickets: encode, decode, sign, verify (pure: no I/O, no clock).

See tickets.ticket and docs/protocol.md section 5.
"""
from memmesh.tickets.ticket import (
    EXPIRED,
    FIELD,
    FORMAT,
    MAX_ADDRESSES,
    MAX_EXPIRES,
    MAX_TICKET_CHARS,
    RECIPIENT,
    SCHEME,
    SECRET,
    SIGNATURE,
    SIZE,
    Address,
    Ticket,
    TicketRejected,
    check,
    decode,
    encode,
    issue,
    parse_address,
    verify_signature,
)

__all__ = [
    "Ticket", "TicketRejected", "Address", "issue", "encode", "decode", "verify_signature",
    "check", "parse_address", "MAX_TICKET_CHARS", "MAX_ADDRESSES", "MAX_EXPIRES", "SCHEME",
    "FORMAT", "SIZE", "FIELD", "SIGNATURE", "SECRET", "EXPIRED", "RECIPIENT",
]
