"""Where a node's home is when no --home names it: the one rule, importable on its own.

The CLI asks it before anything else is imported (node/home.py pulls in storage, keys and the
CRDT); node.home.default_home is the same rule.
"""
from __future__ import annotations

import os
from pathlib import Path


def default_home() -> Path:
    """$MEMMESH_HOME, else the per-user data directory (XDG on Linux)."""
    env = os.environ.get("MEMMESH_HOME")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "memmesh"
