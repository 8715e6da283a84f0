"""What several sync messages carry: feed positions, equivocation evidence, entries as
stored, the pull cursor, peers and their addresses; each with its strict decoder."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memmesh.crdt.entry import MAX_HEADER_BYTES, MAX_PAYLOAD_BYTES, MAX_STORES, id_to_raw, raw_to_id
from memmesh.node.sync.limits import (
    MAX_ADDR_LEN,
    MAX_ADDRS,
    MAX_AUTHORS,
    MAX_ENTRIES_PER_MESSAGE,
    MAX_EVIDENCE_PER_AUTHOR,
    MAX_PEERS,
)
from memmesh.node.sync.wire import bad, bounded_list, check_fields, check_text, key_text, raw32, seq_or_none, uint

EntryWire = tuple[bytes, dict[str, bytes | None]]
Feeds = Mapping[str, tuple[int, str | None]]  # author -> (highest seq, its entry id)
Evidence = dict[str, list[str]]  # flagged author -> entry ids kept as evidence


def encode_feeds(feeds: Mapping[str, tuple[int, str | None]]) -> dict[bytes, list]:
    from memmesh.auth.keys import PublicKey

    return {PublicKey.parse(a).raw: [seq, None if head is None else id_to_raw(head)] for a, (seq, head) in feeds.items()}


def decode_feeds(value: Any) -> Feeds:
    if type(value) is not dict or len(value) > MAX_AUTHORS:
        raise bad(f"feeds must be a map of at most {MAX_AUTHORS} authors")
    out: dict[str, tuple[int, str | None]] = {}
    for author, pos in value.items():
        if type(pos) is not list or len(pos) != 2:
            raise bad("a feed position is [seq, head]")
        head = None if pos[1] is None else raw_to_id(raw32(pos[1], "a feed head"))
        out[key_text(author, "a feed author")] = (seq_or_none(pos[0], "a feed seq"), head)
    return out


def encode_evidence(evidence: Mapping[str, Sequence[str]]) -> dict[bytes, list[bytes]]:
    from memmesh.auth.keys import PublicKey

    return {PublicKey.parse(a).raw: [id_to_raw(i) for i in ids[:MAX_EVIDENCE_PER_AUTHOR]] for a, ids in evidence.items()}


def decode_evidence(value: Any) -> Evidence:
    if type(value) is not dict or len(value) > MAX_AUTHORS:
        raise bad("evidence must be a map of authors")
    return {key_text(a, "an evidence author"): [raw_to_id(raw32(i, "an evidence id"))
                                             for i in bounded_list(ids, "evidence ids", MAX_EVIDENCE_PER_AUTHOR)]
            for a, ids in value.items()}


def encode_entries(entries: Sequence[EntryWire]) -> list[list]:
    return [[header, dict(payloads)] for header, payloads in entries]


def decode_entries(value: Any) -> list[EntryWire]:
    """Entries as they travel; their content is checked by the database's pipeline."""
    out: list[EntryWire] = []
    for item in bounded_list(value, "entries", MAX_ENTRIES_PER_MESSAGE):
        if type(item) is not list or len(item) != 2:
            raise bad("an entry is [header, payloads]")
        header, payloads = item
        if type(header) is not bytes or len(header) > MAX_HEADER_BYTES:
            raise bad(f"an entry header is at most {MAX_HEADER_BYTES} bytes")
        if type(payloads) is not dict or len(payloads) > MAX_STORES:
            raise bad(f"entry payloads are a map of at most {MAX_STORES} stores")
        checked: dict[str, bytes | None] = {}
        for store, data in payloads.items():
            if type(store) is not str or not store or len(store) > 128:
                raise bad("a store name is a non-empty string of at most 128 characters")
            if data is not None and (type(data) is not bytes or len(data) > MAX_PAYLOAD_BYTES):
                raise bad(f"a payload is nil or at most {MAX_PAYLOAD_BYTES} bytes")
            checked[store] = data
        out.append((header, checked))
    return out


def decode_cursor(value: Any) -> tuple[int, str] | None:
    if value is None:
        return None
    if type(value) is not list or len(value) != 2:
        raise bad("a cursor is [height, entry id] or nil")
    return uint(value[0], "cursor height"), raw_to_id(raw32(value[1], "cursor id"))


def encode_cursor(cursor: tuple[int, str] | None) -> list | None:
    return None if cursor is None else [cursor[0], id_to_raw(cursor[1])]


def check_addr(value: Any) -> str:
    text = check_text(value, "an address", MAX_ADDR_LEN)
    if not text.startswith("http:"):
        raise bad(f"an address looks like http:<host>:<port>, got {text[:40]!r}")
    return text


@dataclass(frozen=True)
class PeerInfo:
    key: str
    addrs: tuple[str, ...]


def encode_peers(peers: Sequence[PeerInfo]) -> list[dict]:
    from memmesh.auth.keys import PublicKey

    return [{"key": PublicKey.parse(p.key).raw, "addrs": list(p.addrs[:MAX_ADDRS])} for p in peers[:MAX_PEERS]]


def decode_peers(value: Any) -> list[PeerInfo]:
    out = []
    for item in bounded_list(value, "peers", MAX_PEERS):
        if type(item) is not dict:
            raise bad("a peer is a map")
        check_fields(item, ("addrs", "key"))
        out.append(PeerInfo(key_text(item["key"], "a peer key"),
                            tuple(check_addr(a) for a in bounded_list(item["addrs"], "peer addresses", MAX_ADDRS))))
    return out
