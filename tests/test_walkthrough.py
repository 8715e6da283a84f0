"""The memory walkthrough a user would type, through the installed `memmesh` command.

The script lives in the shared checks beside the project (it is the acceptance check of the
memory issue); this test runs it against this checkout's installed command.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT.parent / "shared" / "checks" / "memory-walkthrough.sh"


@pytest.mark.slow
@pytest.mark.skipif(not SCRIPT.exists(), reason="the shared walkthrough script is not beside this checkout")
def test_memory_walkthrough_passes():
    memmesh = Path(sys.executable).parent / "memmesh"
    if not memmesh.exists():
        found = shutil.which("memmesh")
        assert found, "the memmesh console script is not installed"
        memmesh = Path(found)
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "MEMMESH": str(memmesh)}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all steps behave" in proc.stdout
