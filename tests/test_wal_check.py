"""node/wal_check.py: reading a write-ahead log as SQLite would, on synthetic and real logs.

The synthetic logs are built here with the plain checksum (``checksum``), so the vectorised
one in ``check_wal`` is held to it; the real ones are written by SQLite, damaged, and opened
by SQLite again, so "the frames SQLite keeps" is SQLite's answer, not ours.
"""
from __future__ import annotations

import os
import random
import shutil
import sqlite3
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memmesh.node.wal_check import FRAME_HEADER, WAL_HEADER, WalReport, _Summer, check_wal, checksum, read_wal_index

PAGE = 512


def build_wal(frames: list[tuple[int, bytes]], *, page: int = PAGE, big: bool = False,
              salts: tuple[int, int] = (11, 22), chain_from: dict[int, tuple[int, int]] | None = None,
              frame_salts: dict[int, tuple[int, int]] | None = None) -> bytes:
    """A WAL of ``frames`` (db size after commit, 0 for a non-commit frame; page bytes).
    ``chain_from[i]``: frame i's checksum continues from these values instead of the chain
    (a frame left by another transaction); ``frame_salts[i]``: frame i's salts."""
    magic = 0x377F0683 if big else 0x377F0682
    head = struct.pack(">6I", magic, 3007000, page, 0, *salts)
    state = checksum(head, 0, 0, big)
    out = [head, struct.pack(">2I", *state)]
    for i, (db_size, data) in enumerate(frames):
        assert len(data) == page
        f1, f2 = (frame_salts or {}).get(i, salts)
        first = struct.pack(">2I", i + 1, db_size)
        state = checksum(first + data, *(chain_from or {}).get(i, state), big)
        out += [first, struct.pack(">4I", f1, f2, *state), data]
    return b"".join(out)


def pages(n: int, seed: int = 0) -> list[bytes]:
    rnd = random.Random(seed)
    return [rnd.randbytes(PAGE) for _ in range(n)]


def commits(n: int, every: int = 3) -> list[tuple[int, bytes]]:
    """n frames, every ``every``-th one (and the last) commits."""
    return [((i + 1) if (i + 1) % every == 0 or i == n - 1 else 0, p) for i, p in enumerate(pages(n))]


# ------------------------------------------------------------------------ synthetic logs


@settings(deadline=None)  # the first example imports numpy
@given(st.binary(min_size=8, max_size=2048).map(lambda b: b[: len(b) // 8 * 8]), st.integers(0, 2**32 - 1),
       st.integers(0, 2**32 - 1), st.booleans())
def test_both_fast_checksums_are_sqlites(data, s0, s1, big):
    summer = _Summer(len(data) // 8, big)
    for use_numpy in (False, True):
        got = summer.chain((s0, s1), summer.contributions([data], use_numpy)[0])
        assert got == checksum(data, s0, s1, big)


@pytest.mark.parametrize("big", [False, True])
def test_an_intact_log_is_read_to_its_last_commit(big):
    wal = build_wal(commits(10, every=4)[:-1] + [(0, pages(1, 9)[0])], big=big)  # the last frame commits nothing
    assert check_wal(wal) == WalReport(frames=10, valid=10, committed=8, problem=None)


def test_empty_and_short_logs_are_fine():
    assert check_wal(b"") == WalReport(0, 0, 0, None)
    assert check_wal(os.urandom(20)) == WalReport(0, 0, 0, None)
    assert check_wal(build_wal([])).problem is None


@given(st.data())
def test_a_log_cut_anywhere_opens(data):
    """A crash tears the last frame: whatever length is left, nothing committed is lost unseen."""
    wal = build_wal(commits(6, every=2))
    cut = data.draw(st.integers(0, len(wal)))
    report = check_wal(wal[:cut])
    assert report.problem is None
    whole = max(0, (cut - WAL_HEADER) // (FRAME_HEADER + PAGE)) if cut >= WAL_HEADER else 0
    assert report.frames == whole and report.valid == whole and report.committed == whole // 2 * 2


@given(st.binary(max_size=4096), st.booleans())
def test_random_bytes_never_raise(data, with_header):
    if with_header:
        data = build_wal([]) + data
    report = check_wal(data)
    assert 0 <= report.committed <= report.valid <= report.frames


def test_a_damaged_frame_before_committed_ones_is_refused():
    wal = bytearray(build_wal(commits(9)))
    at = WAL_HEADER + 3 * (FRAME_HEADER + PAGE) + FRAME_HEADER + 100  # the page of frame 4
    wal[at] ^= 0xFF
    report = check_wal(bytes(wal))
    assert (report.valid, report.committed) == (3, 3)
    assert report.problem == "frame 4 of 9 fails its checksum, and 2 committed transactions after it would be silently dropped"


def test_a_damaged_stored_checksum_is_refused_too():
    """The hit frame's own checksum field: the next frame verifies from what it should have been."""
    wal = bytearray(build_wal(commits(6)))
    at = WAL_HEADER + 2 * (FRAME_HEADER + PAGE) + 16  # frame 3's checksum; frame 3 commits
    wal[at:at + 8] = bytes(8)
    assert check_wal(bytes(wal)).problem == (
        "frame 3 of 6 fails its checksum, and 1 committed transaction after it would be silently dropped")


def test_damaged_salts_are_refused():
    wal = bytearray(build_wal(commits(6)))
    at = WAL_HEADER + 1 * (FRAME_HEADER + PAGE) + 8  # frame 2's first salt
    wal[at] ^= 1
    assert check_wal(bytes(wal)).problem.startswith("frame 2 of 6 fails its checksum, and 2 committed")


def test_a_damaged_last_transaction_cannot_be_told_from_a_torn_one():
    """Damage in the last committed transaction looks exactly like a crash mid-write: it opens."""
    wal = bytearray(build_wal(commits(6)))
    wal[-10] ^= 0xFF
    report = check_wal(bytes(wal))
    assert report.problem is None and report.committed == 3


def test_leftovers_of_an_uncommitted_transaction_are_normal():
    """After a rollback (or a crash before the commit frame), the next transaction overwrites
    from the last commit with the same salts: the old frames behind it break the chain."""
    frames = commits(6) + [(0, p) for p in pages(4, 7)]
    wal = build_wal(frames, chain_from={6: (123, 456)})  # frames 7-10: another transaction's chain
    report = check_wal(wal)
    assert report == WalReport(frames=10, valid=6, committed=6, problem=None)


def test_frames_of_an_older_generation_are_ignored():
    """The log restarts from the top with new salts and is not truncated: the rest is old."""
    frames = commits(4, every=2) + commits(4, every=2)
    old = dict.fromkeys(range(4, 8), (10, 21))
    report = check_wal(build_wal(frames, frame_salts=old, chain_from={4: (1, 2)}))
    assert report == WalReport(frames=8, valid=4, committed=4, problem=None)


def test_a_damaged_header_with_frames_behind_it_is_refused():
    wal = bytearray(build_wal(commits(5)))
    wal[9] ^= 4  # the page size field
    assert check_wal(bytes(wal), page_size=PAGE).problem == (
        "its header is damaged while 5 frames follow it, which SQLite would ignore")
    wal = bytearray(build_wal(commits(5)))
    wal[26] ^= 4  # the header's checksum
    assert check_wal(bytes(wal)).problem.startswith("its header is damaged while 5 frames follow it")
    lone = bytearray(build_wal([]))
    lone[0] ^= 1
    assert check_wal(bytes(lone)).problem is None  # nothing follows: nothing is lost


# ------------------------------------------------------------------------ real logs

ROWS = 30


@pytest.fixture(scope="module")
def real_wal(tmp_path_factory):
    """A database whose table and ROWS one-row transactions all sit in its WAL."""
    d = tmp_path_factory.mktemp("realwal")
    db = d / "a.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t (x BLOB)")
    rnd = random.Random(5)
    for _ in range(ROWS):
        conn.execute("INSERT INTO t VALUES (?)", (rnd.randbytes(700),))
    template = d / "template"
    template.mkdir()
    shutil.copy(db, template / "a.db")
    shutil.copy(f"{db}-wal", template / "a.db-wal")  # while conn is open: nothing checkpointed
    conn.close()
    return template


def _commit_frames(wal: bytes, upto: int) -> int:
    page = struct.unpack(">I", wal[8:12])[0]
    return sum(1 for i in range(upto)
               if struct.unpack(">I", wal[WAL_HEADER + i * (FRAME_HEADER + page) + 4:][:4])[0])


def test_a_real_log_reads_whole(real_wal):
    wal = (real_wal / "a.db-wal").read_bytes()
    report = check_wal(wal)
    assert report.problem is None and report.valid == report.frames == report.committed
    assert _commit_frames(wal, report.committed) == ROWS + 1


def test_the_wal_index_is_read(real_wal, tmp_path):
    for name in ("a.db", "a.db-wal"):
        shutil.copy(real_wal / name, tmp_path / name)
    conn = sqlite3.connect(f"file:{tmp_path / 'a.db'}?mode=ro", uri=True)
    conn.execute("SELECT count(*) FROM t").fetchone()
    shm = (tmp_path / "a.db-shm").read_bytes()
    conn.close()
    wal = (tmp_path / "a.db-wal").read_bytes()
    assert read_wal_index(shm[:96]) == (check_wal(wal).committed, wal[16:24])
    damaged = bytearray(shm[:96])
    damaged[16] ^= 1  # mxFrame, in both copies: the header's checksum no longer matches
    damaged[48 + 16] ^= 1
    assert read_wal_index(bytes(damaged)) is None
    assert read_wal_index(b"") is None and read_wal_index(bytes(96)) is None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_sqlite_keeps_exactly_the_frames_it_says(real_wal, data):
    """Damage a real log anywhere: SQLite keeps the transactions of the first ``committed``
    frames, no more, no fewer; a refusal comes only when committed ones follow the damage."""
    wal = bytearray((real_wal / "a.db-wal").read_bytes())
    at = data.draw(st.integers(0, len(wal) - 1), label="offset")
    length = data.draw(st.sampled_from([1, 8, 64]), label="length")
    wal[at:at + length] = bytes(b ^ 0x5A for b in wal[at:at + length])
    report = check_wal(bytes(wal), page_size=4096)
    kept = _commit_frames(bytes(wal), report.committed)
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(real_wal / "a.db", Path(tmp) / "a.db")
        (Path(tmp) / "a.db-wal").write_bytes(bytes(wal))
        conn = sqlite3.connect(f"file:{Path(tmp) / 'a.db'}?mode=ro", uri=True)  # never checkpoints
        try:
            rows = conn.execute("SELECT count(*) FROM t").fetchone()[0]
        except sqlite3.OperationalError as exc:  # not even the CREATE TABLE survived
            assert "no such table" in str(exc)
            rows = -1
        index = read_wal_index((Path(tmp) / "a.db-shm").read_bytes()[:96])
        conn.close()
    assert rows == kept - 1
    # What SQLite says it kept is what the full walk finds, and the short path agrees with it.
    if index is not None and index[1] == bytes(wal[16:24]):
        assert index[0] == report.committed
        assert check_wal(bytes(wal), page_size=4096, recovered=index) == WalReport(
            report.frames, report.committed, report.committed, report.problem)
    if report.problem is not None:
        assert kept < ROWS + 1  # something committed really was dropped
    else:  # at most the last transaction, which damage and a torn write leave alike
        assert kept >= ROWS
