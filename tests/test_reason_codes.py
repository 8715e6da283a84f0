"""Every reason code the code can give is documented, in docs/security.md and docs/protocol.md.

Reason codes are what peers, logs, per-peer counters and `memmesh explain` show; an
independent implementation needs each of them, so a new code without documentation fails here.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = re.compile(r"""["']((?:entry|yjs|auth|erase)\.[a-z0-9_]+)["']""")


def _codes_in_source() -> set[str]:
    codes: set[str] = set()
    for package in ("auth", "crdt"):
        for path in (ROOT / package).glob("*.py"):
            codes.update(CODE.findall(path.read_text()))
    return codes


def test_the_scan_finds_the_codes():
    codes = _codes_in_source()
    assert {"entry.signature", "yjs.depth", "auth.voided", "erase.bad_op", "entry.pending_evicted"} <= codes


def test_every_reason_code_is_in_security_md():
    doc = (ROOT / "docs" / "security.md").read_text()
    missing = sorted(c for c in _codes_in_source() if f"`{c}`" not in doc)
    assert missing == [], f"document these reason codes in docs/security.md: {missing}"


def test_every_reason_code_is_in_protocol_md():
    doc = (ROOT / "docs" / "protocol.md").read_text()
    missing = sorted(c for c in _codes_in_source() if f"`{c}`" not in doc)
    assert missing == [], f"document these reason codes in docs/protocol.md: {missing}"
