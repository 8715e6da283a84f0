"""Subprocess for the database-level crash test: commits memory rows until killed.

    python tests/crash_db_writer.py HOME

Opens (or creates) a node home and its bank database, then commits one signed entry per
memory row, printing "ACK <n> <entry id>" only after commit() returned, i.e. after the SQLite
transaction committed. The test kills it with SIGKILL at random moments.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memmesh.node.home import Home  # noqa: E402


def main() -> int:
    home = Path(sys.argv[1])
    node = Home.open(home, create=True)
    ids = node.database_ids()
    if ids:
        db = node.database(ids[0])
        key = node.load_key("bank")
    else:
        key = node.new_key("bank")
        db = node.create_database(key, {"kind": "bank", "display_name": "crash"})
    n = len(db.rows("memory"))
    print(f"START {n}", flush=True)
    while True:
        txn = db.transaction(key)
        txn.append("memory", {"key": f"k{n}", "value": "x" * (n % 200)})
        entry_id = txn.commit()
        print(f"ACK {n} {entry_id}", flush=True)
        n += 1


if __name__ == "__main__":
    sys.exit(main())
