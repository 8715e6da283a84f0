"""Suite-wide settings, set before any node module is imported (subprocesses inherit them)."""
import os

# Auto-recall waits 50 ms for its stores by default; a loaded CI machine can miss that, so the
# suite runs with a deadline that only a held index misses (tests of the deadline set their own).
os.environ.setdefault("MEMMESH_AUTO_RECALL_DEADLINE_MS", "10000")

from pathlib import Path  # noqa: E402 (the environment above is set before any node import)

import pytest  # noqa: E402


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """An initialised home with no embedder (a test file's own ``home`` fixture overrides it)."""
    from node.library import Node

    h = tmp_path / "node"
    node, _ = Node.init(h)
    with node:
        node.run("embedder.set", {"provider": "none"})
    return h
