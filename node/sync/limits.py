"""The bounds of the sync protocol (docs/protocol.md section 6.3): what one body, page or
message may hold at most. Decoding refuses anything beyond them before building it."""
from __future__ import annotations

PROTOCOL_VERSION = 1
MAX_BODY_BYTES = 8 * 1024 * 1024  # a page of entries, or a push, plus framing
DEFAULT_PAGE_BYTES = 2 * 1024 * 1024 + 64 * 1024  # at least one entry of the largest size
MAX_PAGE_BYTES = 6 * 1024 * 1024
MAX_ENTRIES_PER_MESSAGE = 20_000
MAX_AUTHORS = 100_000
MAX_WANT = 10_000
MAX_EVIDENCE_PER_AUTHOR = 256
MAX_PEERS = 256
MAX_ADDRS = 8
MAX_ADDR_LEN = 300
MAX_TEXT = 4096
U53 = 2**53 - 1
