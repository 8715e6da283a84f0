"""Suite-wide settings, set before any node module is imported (subprocesses inherit them)."""
import os

# Auto-recall waits 50 ms for its stores by default; a loaded CI machine can miss that, so the
# suite runs with a deadline that only a held index misses (tests of the deadline set their own).
os.environ.setdefault("MEMMESH_AUTO_RECALL_DEADLINE_MS", "10000")
