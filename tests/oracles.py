"""Reference answers that the product's fast paths must agree with (tests and bench only).

- ``find_secret_unfiltered``: node.memory.secrets.find_secret with every plugin on every
  window, the pre-filter off; the pre-filter is sound when the two always agree
  (tests/test_secrets.py, bench/credentials.py).
- ``detect_unanchored``: node.memory.hygiene.detect on normalised text without the anchor
  scan; the anchors are sound when the two always agree (tests/test_hygiene.py,
  bench/hygiene.py).
"""
from __future__ import annotations

from memmesh.node.memory import hygiene, secrets


def find_secret_unfiltered(text: str) -> str | None:
    return secrets._scan(text[:secrets.MAX_CHARS], prefilter=False)


def detect_unanchored(norm: str) -> str | None:
    for name, pattern in hygiene._RULES_BY_NAME:
        if pattern.search(norm):
            return name
    return None
