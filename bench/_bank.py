"""Writing a benchmark bank: memories and their hashed-embedder vectors, ``rows_per_entry`` to a
signed entry, into a SQLite file, with no view following it (bench/scale.py, bench/open_db.py)."""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Mem = tuple[str, str, list[str]]  # key, value, tags


def write_bank(path: Path, mems: Sequence[Mem], name: str, *, rows_per_entry: int = 200,
               progress: Callable[[int, float], None] | None = None) -> tuple[Any, Any, Any, float]:
    """(storage, the root's signing key, the database, seconds spent writing) of a new bank at
    ``path`` holding ``mems``; ``progress(done, seconds)`` after every 50 entries."""
    from memmesh.auth.keys import SigningKey
    from memmesh.crdt.database import Database
    from memmesh.node.memory.embedders import HashedEmbedder
    from memmesh.node.memory.rows import MEMORY_STORE, embedding_value, memory_value
    from memmesh.node.storage import SqliteStorage

    hashed = HashedEmbedder()
    path.unlink(missing_ok=True)
    storage = SqliteStorage(path)
    key = SigningKey.generate()
    db = Database.create(storage, key, meta={"kind": "bank", "display_name": name})
    t0 = time.perf_counter()
    for start in range(0, len(mems), rows_per_entry):
        rows = [memory_value(k, v, tags) for k, v, tags in mems[start:start + rows_per_entry]]
        vectors = hashed.embed([f"{r['key']} {r['value']}" for r in rows])
        txn = db.transaction(key)
        for row, vec in zip(rows, vectors, strict=True):
            txn.append(hashed.store_name, embedding_value(txn.append(MEMORY_STORE, row), vec))
        txn.commit()
        if progress is not None and start and start % (50 * rows_per_entry) == 0:
            progress(start, time.perf_counter() - t0)
    return storage, key, db, time.perf_counter() - t0
