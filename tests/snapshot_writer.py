"""A process that writes memories and view snapshots of one bank without end, until it is
killed (tests/test_view_snapshots.py kills it with SIGKILL at some moment of its work)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from memmesh.node.memory.snapshot import Snapshots  # noqa: E402
from memmesh.node.storage import SqliteStorage  # noqa: E402
from tests.dbkit import grant, new_db  # noqa: E402
from tests.test_view_snapshots import ADMIN, ALICE, view, write  # noqa: E402


def main() -> None:
    db_path, views = Path(sys.argv[1]), Path(sys.argv[2])
    storage = SqliteStorage(db_path)
    db = new_db(ADMIN, storage)
    grant(db, ADMIN, ALICE, "write", 10)
    write(db, ALICE, 0, 400, keys=300, supersede_every=9)
    v = view(db, Snapshots(views, min_docs=1))
    v.save_snapshot()
    print("saved", flush=True)
    start = 400
    while True:
        write(db, ALICE, start, 200, keys=300, supersede_every=9)
        start += 200
        v.save_snapshot()


if __name__ == "__main__":
    main()
