"""The signed entry format: encoding, ids, signatures, payload descriptors, erasure."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memmesh.auth.keys import DOMAIN_ENTRY, SigningKey
from memmesh.crdt.entry import (
    MAX_ENTRY_BYTES,
    MAX_HEADER_BYTES,
    client_id_for,
    decode_entry,
    id_of,
    sign_entry,
)
from memmesh.crdt.errors import EntryRejected
from memmesh.crdt.yjs import encode_rows

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent


def _key(n: int = 1) -> SigningKey:
    return SigningKey.from_seed(bytes([n]) * 32)


def _root(key: SigningKey):
    c = client_id_for(key.public.raw)
    return sign_entry(key, db=None, seq=0, prev=None, parents=[], ts=1,
                      payloads={"meta": (encode_rows(c, 0, "meta", [(f"{c}/0", {"kind": "bank"})]), 0, 1)},
                      nonce=bytes(16))


def _child(key: SigningKey, root, value="hello"):
    c = client_id_for(key.public.raw)
    return sign_entry(key, db=root.id, seq=1, prev=root.id, parents=[root.id], ts=2,
                      payloads={"memory": (encode_rows(c, 0, "memory", [(f"{c}/0", {"key": "k", "value": value})]), 0, 1)})


def test_round_trip_and_id_is_hash_of_signed_header():
    k = _key()
    root = _root(k)
    e = _child(k, root)
    again = decode_entry(e.header, e.payloads, expected_db=root.id)
    assert again == e
    assert e.id == "sha256:" + hashlib.sha256(e.header).hexdigest()
    assert root.is_root and not e.is_root and e.db == root.id


def test_every_header_byte_is_covered():
    k = _key()
    root = _root(k)
    e = _child(k, root)
    for i in range(len(e.header)):
        tampered = bytearray(e.header)
        tampered[i] ^= 0x01
        with pytest.raises(EntryRejected):
            decode_entry(bytes(tampered), e.payloads, expected_db=root.id)


def test_forged_signature_by_other_key_rejected():
    k, mallory = _key(1), _key(2)
    root = _root(k)
    e = _child(k, root)
    body = e.header[1:-66]
    forged = b"\x92" + body + b"\xc4\x40" + mallory.sign(DOMAIN_ENTRY, body)
    with pytest.raises(EntryRejected) as err:
        decode_entry(forged, e.payloads, expected_db=root.id)
    assert err.value.reason == "entry.signature"


def test_signature_from_another_domain_rejected():
    k = _key()
    root = _root(k)
    e = _child(k, root)
    body = e.header[1:-66]
    wrong = b"\x92" + body + b"\xc4\x40" + k.sign(b"ticket", body)
    with pytest.raises(EntryRejected) as err:
        decode_entry(wrong, e.payloads)
    assert err.value.reason == "entry.signature"


def test_payload_must_match_descriptor():
    k = _key()
    root = _root(k)
    e = _child(k, root)
    other = _child(k, root, value="something else")
    with pytest.raises(EntryRejected) as err:
        decode_entry(e.header, {"memory": other.payloads["memory"]})
    assert err.value.reason == "entry.payload"
    with pytest.raises(EntryRejected) as err:
        decode_entry(e.header, {"config": b"x"})
    assert err.value.reason == "entry.payload"


def test_erased_payload_still_verifies_and_keeps_its_id():
    k = _key()
    root = _root(k)
    e = _child(k, root)
    erased = decode_entry(e.header, {"memory": None}, expected_db=root.id)
    assert erased.id == e.id
    assert erased.payloads == {"memory": None}
    assert erased.stores == e.stores


def test_replay_into_another_database_rejected():
    k = _key()
    root_a, root_b = _root(k), sign_entry(k, db=None, seq=0, prev=None, parents=[], ts=1,
                                          payloads={"meta": (b"\x00\x00", 0, 1)}, nonce=b"\x01" * 16)
    e = _child(k, root_a)
    with pytest.raises(EntryRejected) as err:
        decode_entry(e.header, e.payloads, expected_db=root_b.id)
    assert err.value.reason == "entry.db"
    with pytest.raises(EntryRejected) as err:
        decode_entry(root_a.header, root_a.payloads, expected_db=root_b.id)
    assert err.value.reason == "entry.db"


def test_non_canonical_encoding_rejected():
    k = _key()
    root = _root(k)
    e = _child(k, root)
    body = msgpack.unpackb(e.header[1:-66], raw=False)
    # Same logical fields, keys in another order: a different byte string for one entry.
    reordered = dict(reversed(list(body.items())))
    bb = msgpack.packb(reordered, use_bin_type=True)
    header = b"\x92" + bb + b"\xc4\x40" + k.sign(DOMAIN_ENTRY, bb)
    with pytest.raises(EntryRejected) as err:
        decode_entry(header, e.payloads)
    assert err.value.reason in ("entry.format", "entry.canonical")
    # An integer in a wider encoding than needed.
    bb2 = e.header[1:-66].replace(b"\xa3seq\x01", b"\xa3seq\xcd\x00\x01")
    assert bb2 != e.header[1:-66]
    header2 = b"\x92" + bb2 + b"\xc4\x40" + k.sign(DOMAIN_ENTRY, bb2)
    with pytest.raises(EntryRejected) as err:
        decode_entry(header2, e.payloads)
    assert err.value.reason == "entry.canonical"


def test_client_id_bound_to_author():
    k, other = _key(1), _key(2)
    root = _root(k)
    c_other = client_id_for(other.public.raw)
    body = msgpack.unpackb(_child(k, root).header[1:-66], raw=False)
    upd = encode_rows(c_other, 0, "memory", [(f"{c_other}/0", 1)])
    body["stores"] = {"memory": [hashlib.sha256(upd).digest(), len(upd), c_other, 0, 1]}
    bb = msgpack.packb(body, use_bin_type=True)
    header = b"\x92" + bb + b"\xc4\x40" + k.sign(DOMAIN_ENTRY, bb)
    with pytest.raises(EntryRejected) as err:
        decode_entry(header, {"memory": upd})
    assert err.value.reason == "entry.client"


def test_oversize_rejected_before_parsing():
    k = _key()
    root = _root(k)
    e = _child(k, root)
    with pytest.raises(EntryRejected) as err:
        decode_entry(e.header + b"\x00" * MAX_HEADER_BYTES, e.payloads)
    assert err.value.reason == "entry.size"
    with pytest.raises(EntryRejected) as err:
        decode_entry(e.header, {"memory": b"\x00" * MAX_ENTRY_BYTES})
    assert err.value.reason == "entry.size"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_random_bytes_rejected_cleanly(data):
    with pytest.raises(EntryRejected):
        decode_entry(data, {})


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_truncations_rejected_cleanly(data):
    k = _key()
    e = _child(k, _root(k))
    cut = data.draw(st.integers(0, len(e.header) - 1))
    with pytest.raises(EntryRejected):
        decode_entry(e.header[:cut], e.payloads)


def _vector():
    return json.loads((DATA / "entry_vector.json").read_text())


def test_protocol_test_vector():
    """docs/protocol.md's vector: an independent implementation must produce these bytes."""
    v = _vector()
    key = SigningKey.from_seed(bytes.fromhex(v["seed"]))
    assert str(key.public) == v["public_key"]
    assert client_id_for(key.public.raw) == v["client"]
    root = sign_entry(key, db=None, seq=0, prev=None, parents=[], ts=v["root"]["ts"],
                      payloads={name: (bytes.fromhex(p["update"]), p["clock"], p["clock_len"])
                                for name, p in v["root"]["payloads"].items()},
                      nonce=bytes.fromhex(v["root"]["nonce"]))
    assert root.header.hex() == v["root"]["header"]
    assert root.id == v["root"]["id"] == id_of(bytes.fromhex(v["root"]["header"]))
    assert root.header[-64:].hex() == v["root"]["signature"]
    doc = (ROOT / "docs" / "protocol.md").read_text()
    assert v["root"]["id"] in doc and v["root"]["signature"] in doc
    # Ed25519 is deterministic, so the same fields always give the same bytes.
    decoded = decode_entry(bytes.fromhex(v["root"]["header"]),
                           {n: bytes.fromhex(p["update"]) for n, p in v["root"]["payloads"].items()})
    assert decoded.id == v["root"]["id"]
