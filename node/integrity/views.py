"""`memmesh check`: the view snapshots of a home (node/memory/snapshot.py) against a rebuild.

For each snapshot file of a database, the view it would open (snapshot, then the rows it lacks)
is compared with a view rebuilt from the log the check rebuilt: their fingerprints
(MemoryView.fingerprint: every row, column, label, vector bit and timeline). A snapshot that
would not be used (damaged, stale, of another version) is a notice: the next opening drops it
and rebuilds. One that would be used but differs from the rebuild is damage: `check --repair`
removes it (so does deleting the file by hand). A plain check never writes or removes a file.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memmesh.crdt.database import Database
from memmesh.node.integrity.report import Problem
from memmesh.node.memory.snapshot import VIEWS_DIR, Meta, SnapshotRejected, Snapshots
from memmesh.node.memory.view import MemoryView


@dataclass
class SnapshotFiles:
    """The snapshot files of a home, by database, and those whose header cannot be read."""

    by_db: dict[str, list[tuple[Path, Meta]]]
    unreadable: list[tuple[Path, str]]


def snapshot_files(home: Path) -> SnapshotFiles:
    found = SnapshotFiles({}, [])
    for path in Snapshots(home / VIEWS_DIR, read_only=True).files():
        try:
            meta = Snapshots.meta(path)
        except SnapshotRejected as exc:
            found.unreadable.append((path, str(exc)))
            continue
        found.by_db.setdefault(meta.db, []).append((path, meta))
    return found


def check_views(home: Path, db: Database, files: list[tuple[Path, Meta]], *, repair: bool,
                progress: Callable[[str], None] | None = None) -> tuple[list[dict[str, Any]], list[Problem]]:
    """What each snapshot of ``db`` would show against a rebuild; ``repair`` removes the ones
    that differ."""
    out: list[dict[str, Any]] = []
    problems: list[Problem] = []
    for path, meta in files:
        if progress is not None:
            progress(path.name)
        snaps = Snapshots(home / VIEWS_DIR, min_docs=1, read_only=True)
        if snaps.path_for(meta.db, meta.store, meta.dim) != path:
            out.append(_row(path, meta, "not used: its name does not match what it holds"))
            continue
        # One view at a time: a bank's view may take gigabytes.
        opened = MemoryView(db, embedding_store=meta.store, dim=meta.dim, snapshots=snaps)
        try:
            used, note = opened.opened_from == "snapshot", opened.snapshot_note
            wanted = opened.fingerprint() if used else ""
        finally:
            opened.close()
            del opened
        if not used:
            out.append(_row(path, meta, f"not used: {note}; the next opening rebuilds the view"))
            continue
        rebuilt = MemoryView(db, embedding_store=meta.store, dim=meta.dim)
        try:
            same = rebuilt.fingerprint() == wanted
        finally:
            rebuilt.close()
        if same:
            out.append(_row(path, meta, "matches a rebuild"))
            continue
        removed = False
        if repair:
            path.unlink(missing_ok=True)
            removed = True
        out.append(_row(path, meta, "DIFFERS from a rebuild" + ("; removed" if removed else "")))
        problems.append(Problem("view.snapshot", f"the view snapshot {path.name} (store {meta.store}) differs from "
                                "a view rebuilt from the log" + (": removed, the next opening rebuilds it" if removed
                                                                 else ": run memmesh check --repair, or delete the file"),
                                store=meta.store))
    return out, problems


def _row(path: Path, meta: Meta, verdict: str) -> dict[str, Any]:
    return {"file": path.name, "store": meta.store, "dim": meta.dim, "docs": meta.docs, "verdict": verdict}
