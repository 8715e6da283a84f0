"""Suite-wide settings, set before any node module is imported (subprocesses inherit them)."""
import os

# Auto-recall waits 50 ms for its stores by default; a loaded CI machine can miss that, so the
# suite runs with a deadline that only a held index misses (tests of the deadline set their own).
os.environ.setdefault("MEMMESH_AUTO_RECALL_DEADLINE_MS", "10000")
# Every command's data is checked against its published answer schema (node/commands/answers).
os.environ.setdefault("MEMMESH_CHECK_ANSWERS", "1")

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402 (the environment above is set before any node import)
from typing import TYPE_CHECKING

import pytest  # noqa: E402

if TYPE_CHECKING:
    from memmesh.node.library import Node


# A test file's own ``home`` or ``node`` fixture overrides these; one that only adds to them takes
# the suite's as its argument (``def node(node): node.agents.create_agent("beta"); return node``).
@pytest.fixture
def home(tmp_path: Path) -> Path:
    """An initialised home in ``tmp_path / "node"`` with no embedder."""
    from memmesh.node.library import Node

    h = tmp_path / "node"
    node, _ = Node.init(h)
    with node:
        node.run("embedder.set", {"provider": "none"})
    return h


@pytest.fixture
def node(tmp_path: Path) -> Iterator["Node"]:
    """An open node in ``tmp_path / "home"`` with no embedder and one agent, alpha (tests/homes.py's
    ``alpha_node``), closed afterwards."""
    from tests.homes import alpha_node

    yield from alpha_node(tmp_path / "home")
