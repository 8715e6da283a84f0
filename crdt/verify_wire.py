"""The signature worker's wire format (crdt/verify_worker.py has the description): what the
parent (crdt/verify_process.py) and the worker both read and write."""
from __future__ import annotations

import struct

REQUEST = struct.Struct("<BII")  # kind, ticket, size of what follows
REPLY = struct.Struct("<IIdBI")  # ticket, offset, seconds, final, count of verdicts that follow
COUNT = struct.Struct("<I")
RECORD = struct.Struct("<32s64sI")
LIMIT = struct.Struct("<I")
SIGNATURES = 0  # check these triples
STOP = 1  # check no item of this ticket at or past this index


def signatures_request(items: list[tuple[bytes, bytes, bytes]]) -> bytes:
    """``items``: (author, body, signature) triples, of 32 and 64 bytes for the key and signature."""
    parts = [COUNT.pack(len(items))]
    for author, body, signature in items:
        if len(author) != 32 or len(signature) != 64:
            raise ValueError("the worker takes 32-byte keys and 64-byte signatures")
        parts.append(RECORD.pack(author, signature, len(body)))
        parts.append(body)
    return b"".join(parts)
