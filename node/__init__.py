"""memmesh node: everything that runs (storage, memory, sync, interfaces).

The Python library is ``node.Node`` (see node.library); it is imported lazily so that a
submodule (the storage, a benchmark's view) can be imported without loading every command.
"""
from __future__ import annotations

from typing import Any

__all__ = ["Node"]


def __getattr__(name: str) -> Any:
    if name == "Node":
        from memmesh.node.library import Node

        return Node
    raise AttributeError(name)
