"""memmesh node: everything that runs (storage, memory, sync, interfaces).

The library API is ``node.Node`` (see node.library); it is imported lazily so that submodules,
the CLI among them, start without loading what they do not use.
"""
from __future__ import annotations

from typing import Any

__all__ = ["Node"]


def __getattr__(name: str) -> Any:
    if name == "Node":
        from node.library import Node

        return Node
    raise AttributeError(name)
