"""kill -9 at random moments while a separate process appends (docs/architecture.md, "Storage").

After every kill the file must open, every acknowledged entry must be there with its exact
bytes, every batch must be all there or not at all, and the next run of the writer must
continue appending to the same file. Reproduce a failure with MEMMESH_CRASH_SEED=<seed>
(printed at the start of the test).
"""
from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from memmesh.node.storage import SqliteStorage

try:
    import crash_writer
except ImportError:  # tests/ imported as a package
    from tests import crash_writer

WRITER = Path(__file__).with_name("crash_writer.py")
KILLS = 25


def read_protocol(path: Path) -> list[list[str]]:
    """Complete lines of a writer's stdout, split into words (a torn last line is dropped)."""
    text = path.read_text()
    lines = text.split("\n")[:-1]  # whatever follows the last newline is incomplete
    return [line.split(" ") for line in lines]


class Ledger:
    """What the writers announced and acknowledged, across runs, checked against the file."""

    def __init__(self) -> None:
        self.begun: dict[str, tuple[str, ...]] = {}
        self.acked: set[str] = set()
        self.count = 0  # entries in the file at the last check

    def record(self, lines: list[list[str]]) -> dict:
        run: dict = {"start": None, "done": None, "open_batch": None, "acks": 0}
        for word, *rest in lines:
            if word == "START":
                run["start"] = int(rest[1])
            elif word == "BEGIN":
                self.begun[rest[0]] = tuple(rest[1:])
                run["open_batch"] = rest[0]
            elif word == "ACK":
                batch, new = rest[0], int(rest[1])
                assert new == len(self.begun[batch]), f"batch {batch}: append() reported {new} new entries"
                self.acked.add(batch)
                run["open_batch"] = None
                run["acks"] += 1
            elif word == "DONE":
                run["done"] = int(rest[0])
            else:  # pragma: no cover
                raise AssertionError(f"unexpected writer output {word!r}")
        return run

    def check(self, path: Path) -> int:
        raw = sqlite3.connect(path)
        try:
            assert raw.execute("PRAGMA quick_check").fetchall() == [("ok",)]
        finally:
            raw.close()
        storage = SqliteStorage(path)  # must open whatever moment the writer died at
        try:
            if crash_writer.DB_ID not in storage.databases():
                assert not self.begun, "the database vanished"
                return 0
            stored: dict[str, dict] = {}
            per_batch: dict[str, list[int]] = defaultdict(list)
            for entry in storage.entries(crash_writer.DB_ID):
                meta = crash_writer.verify_entry(entry)  # exact bytes, from the entry itself
                assert entry.id not in stored
                stored[entry.id] = meta
                per_batch[meta["batch"]].append(meta["i"])
            count = storage.count(crash_writer.DB_ID)
        finally:
            storage.close()
        assert count == len(stored)
        for batch, ids in self.begun.items():
            present = sum(i in stored for i in ids)
            assert present in (0, len(ids)), f"batch {batch}: {present} of {len(ids)} entries survived"
            if batch in self.acked:
                assert present == len(ids), f"acknowledged batch {batch} was lost"
        for batch, indices in per_batch.items():  # nothing stored that no writer announced
            assert batch in self.begun, f"entries of unannounced batch {batch}"
            assert sorted(indices) == list(range(len(self.begun[batch])))
        return count


def start_writer(path: Path, out: Path, seed: int, *extra: str) -> subprocess.Popen:
    with open(out, "wb") as stdout, open(out.with_suffix(".err"), "wb") as stderr:
        return subprocess.Popen(
            [sys.executable, str(WRITER), str(path), "--seed", str(seed), *extra],
            stdout=stdout,
            stderr=stderr,
        )


def wait_started(out: Path, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """Until the writer says it opened the file (or it exits, or the timeout passes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if any(words[0] == "START" for words in read_protocol(out)):
            return
        time.sleep(0.005)


@pytest.mark.slow
def test_kill_9_loses_nothing_acknowledged(tmp_path):
    seed = int(os.environ.get("MEMMESH_CRASH_SEED", random.randrange(2**32)))
    print(f"MEMMESH_CRASH_SEED={seed}")
    rng = random.Random(seed)
    path = tmp_path / "node.sqlite"
    ledger = Ledger()
    killed_mid_batch = runs_that_wrote = 0
    started = time.monotonic()

    for k in range(KILLS):
        out = tmp_path / f"run-{k}.out"
        proc = start_writer(path, out, rng.randrange(2**32))
        try:
            # One run in five dies anywhere from its start, even before it opens the file; the
            # others once they have opened it, as a cold interpreter on a loaded machine can take
            # longer to start than the whole kill window.
            early = k % 5 == 0
            if not early:
                wait_started(out, proc)
            time.sleep(rng.uniform(0.020, 0.300) if early else rng.uniform(0.0, 0.150))
        finally:
            proc.kill()  # SIGKILL on POSIX
            proc.wait()
        run = ledger.record(read_protocol(out))
        if run["start"] is not None:  # it got far enough to open the file: it continued it
            assert run["start"] == ledger.count, f"run {k} saw {run['start']} entries, expected {ledger.count}"
        assert run["done"] is None
        killed_mid_batch += run["open_batch"] is not None
        runs_that_wrote += run["acks"] > 0
        ledger.count = ledger.check(path)

    # one last run to completion: the file is still appendable and the writer exits cleanly
    out = tmp_path / "final.out"
    proc = start_writer(path, out, rng.randrange(2**32), "--batches", "30")
    assert proc.wait(timeout=60) == 0, out.with_suffix(".err").read_text()
    lines = read_protocol(out)
    run = ledger.record(lines)
    assert run["start"] == ledger.count
    final = ledger.check(path)
    assert run["done"] == final > ledger.count
    final_run = lines[0][1]
    assert sum(batch.startswith(final_run + "-") for batch in ledger.acked) == 30

    print(
        f"{KILLS} kills, {runs_that_wrote} after acknowledged writes, {killed_mid_batch} in the middle of a "
        f"batch; {len(ledger.acked)} batches acknowledged, {final} entries, "
        f"{path.stat().st_size / 1e6:.1f} MB, {time.monotonic() - started:.1f} s"
    )
    # The kills must really interrupt writing, or the test proves nothing.
    assert runs_that_wrote >= KILLS // 3
    assert killed_mid_batch >= 3
    for p in tmp_path.glob("node.sqlite*"):  # tens of MB: do not keep them in pytest's tmp dirs
        p.unlink()
