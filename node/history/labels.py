"""What every replica derives about a history turn or a chunk summary from its text.

The same two detectors as for a memory row (node/memory/labels.py), with the same rules
(docs/memory.md, "History"):

* the instruction detector (node/memory/hygiene.py): a **flagged** turn or summary is never
  put in a context window (``history window``) nor in any block shown to a model; recall's
  history scope returns it with ``flagged`` (the rule's name) and the trust tier ``flagged``,
  its score times the agent's ``trust_weights.flagged`` (0: never returned);
* the credential scanner (node/memory/secrets.py): a turn or summary holding a **secret** is
  never put in a window or a block shown to a model, and recall's history scope returns it
  only to an agent whose config sets ``include_secrets`` (then with ``secret``). History is
  never embedded (BM25 only), so no embedding provider receives it.

A turn has no key and no tags: its text alone is scanned (``detect(text)``,
``find_secret(text)``). A chunk is judged by the summary it shows (a model's, else the
extractive one). Both are functions of the signed text only, so every replica that holds the
text labels it alike; nothing is written.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memmesh.node.memory.hygiene import detect
from memmesh.node.memory.secrets import find_secret

__all__ = ["CLEAN", "TextLabels", "text_labels"]


@dataclass(frozen=True, slots=True)
class TextLabels:
    flag: str | None  # the hygiene rule that matched, or None
    secret: str | None  # the scanner's name for the credential found, or None

    @property
    def withheld(self) -> bool:
        """Never shown to a model as-is: flagged, or holding a credential."""
        return self.flag is not None or self.secret is not None

    def reason(self) -> str | None:
        """Why it is withheld, for people (None: it is not)."""
        if self.secret is not None:
            return f"secret: {self.secret}"
        if self.flag is not None:
            return f"flagged: {self.flag}"
        return None

    def fields(self) -> dict[str, Any]:
        """``flagged`` and ``secret``, each only when it applies (as on a recalled memory)."""
        out: dict[str, Any] = {}
        if self.flag is not None:
            out["flagged"] = self.flag
        if self.secret is not None:
            out["secret"] = self.secret
        return out


CLEAN = TextLabels(None, None)


def text_labels(text: str | None) -> TextLabels:
    """The labels of a turn's text or a summary (None: the text is not held: nothing to judge)."""
    if text is None:
        return CLEAN
    found = TextLabels(detect(text), find_secret(text))
    return CLEAN if found == CLEAN else found
