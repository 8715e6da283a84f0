"""The error of a refused input to a memory operation (what every memory module raises)."""
from __future__ import annotations

from memmesh.crdt.errors import MemmeshError


class MemoryInputError(MemmeshError):
    """Input to a memory operation that is refused; the message says what to change."""
