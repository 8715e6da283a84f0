"""Subprocess helper for tests/test_crash_consistency.py: append to a store until killed.

    python tests/crash_writer.py FILE [--target storage] [--seed N] [--batches N] [--max-seconds S]

It opens FILE through a *target* (``storage``: node.storage.SqliteStorage; add more targets,
e.g. the Database layer, to TARGETS), then appends batches of 1-20 self-describing entries of
random sizes. Protocol on stdout, one line each, flushed before the next step:

    START <run> <count>            opened; <count> entries were already stored
    BEGIN <batch> <id> <id> ...    about to append this batch (all of it or none must survive)
    ACK <batch> <new>              append() returned: the batch is acknowledged
    DONE <count>                   finished --batches batches (absent when killed)

Every entry checks itself (``verify_entry``): the header is JSON naming its batch, its place in
the batch and the sha256 and length of each payload, and the id is the sha256 of the header. So
a reader can verify exact bytes from the file alone, and tell which batch any entry came from.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

if __name__ == "__main__":  # run as a script from a checkout: make the packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memmesh.crdt.storage import StoredEntry  # noqa: E402

DB_ID = "sha256:" + "c7" * 32  # the one database the writer appends to
STORES = ("memory", "embeddings:test/model", "meta")


# ------------------------------------------------------------------ self-describing entries


def make_entry(rng: random.Random, batch: str, index: int, size: int) -> StoredEntry:
    """One entry of a batch: 1-2 payloads of random sizes (mostly small, sometimes large)."""
    payloads: dict[str, bytes] = {}
    for store in rng.sample(STORES, rng.randint(1, 2)):
        n = rng.randint(8_000, 64_000) if rng.random() < 0.03 else rng.randint(0, 1_500)
        payloads[store] = rng.randbytes(n)
    described = {s: [len(p), hashlib.sha256(p).hexdigest()] for s, p in sorted(payloads.items())}
    header = json.dumps(
        {"batch": batch, "i": index, "n": size, "payloads": described, "pad": rng.randbytes(8).hex()},
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    return StoredEntry("sha256:" + hashlib.sha256(header).hexdigest(), header, payloads)


def verify_entry(entry: StoredEntry) -> dict:
    """Check an entry read back against itself; returns its decoded header."""
    assert entry.id == "sha256:" + hashlib.sha256(entry.header).hexdigest(), f"{entry.id}: header bytes changed"
    meta = json.loads(entry.header)
    assert sorted(entry.payloads) == sorted(meta["payloads"]), f"{entry.id}: payload stores differ"
    for store, (length, digest) in meta["payloads"].items():
        data = entry.payloads[store]
        assert data is not None and len(data) == length, f"{entry.id}: payload {store} has the wrong length"
        assert hashlib.sha256(data).hexdigest() == digest, f"{entry.id}: payload {store} bytes changed"
    return meta


# ------------------------------------------------------------------ targets


class StorageTarget:
    """Appends straight to node.storage.SqliteStorage."""

    def __init__(self, path: str) -> None:
        from memmesh.node.storage import SqliteStorage

        self.storage = SqliteStorage(path)
        # Checkpoint the WAL into the main file often (default: every 1000 pages), so that
        # kills also land in the middle of checkpoints, not only of commits.
        self.storage._conn.execute("PRAGMA wal_autocheckpoint=50")
        self.storage.add_database(DB_ID)

    def count(self) -> int:
        return self.storage.count(DB_ID)

    def append(self, entries: Sequence[StoredEntry]) -> int:
        return self.storage.append(DB_ID, entries)

    def close(self) -> None:
        self.storage.close()


TARGETS = {"storage": StorageTarget}


# ------------------------------------------------------------------ main


def emit(*words: object) -> None:
    sys.stdout.write(" ".join(map(str, words)) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--target", choices=sorted(TARGETS), default="storage")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--batches", type=int, default=None, help="stop after this many (default: run until killed)")
    parser.add_argument("--max-seconds", type=float, default=30.0, help="safety stop if nobody kills us")
    args = parser.parse_args(argv)

    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    run = f"{seed:08x}"
    target = TARGETS[args.target](args.file)
    emit("START", run, target.count())
    deadline = time.monotonic() + args.max_seconds
    done = 0
    while (args.batches is None or done < args.batches) and time.monotonic() < deadline:
        batch = f"{run}-{done}"
        size = rng.randint(1, 20)
        entries = [make_entry(rng, batch, i, size) for i in range(size)]
        emit("BEGIN", batch, *(e.id for e in entries))
        new = target.append(entries)
        emit("ACK", batch, new)
        done += 1
    if args.batches is not None:
        emit("DONE", target.count())
    target.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
