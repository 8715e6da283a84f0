"""memmesh node: everything that runs (storage, memory, sync, interfaces).

The Python library is ``node.connect`` (node/client.py: through the home's serve when one runs)
and ``node.Node`` (node/library.py: the home opened in this process); both are imported lazily so
that a submodule (the storage, a benchmark's view) can be imported without loading every command.
"""
from __future__ import annotations

from typing import Any

__all__ = ["Client", "Node", "connect"]


def __getattr__(name: str) -> Any:
    if name == "Node":
        from memmesh.node.library import Node

        return Node
    if name in ("Client", "connect"):
        from memmesh.node import client as module

        return getattr(module, name)
    raise AttributeError(name)
