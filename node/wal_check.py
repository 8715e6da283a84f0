"""Would opening this write-ahead log silently lose committed transactions? (sans-IO, on bytes)

SQLite's WAL (https://www.sqlite.org/fileformat.html#the_write_ahead_log) is a 32-byte header
then frames: a 24-byte frame header (page number, database size after commit -- non-zero only
on a transaction's last frame --, the two salts, a cumulative checksum) and one page. SQLite
reads frames in order and stops at the first one whose salts differ from the header's or whose
checksum, chained from the previous frame, fails; it keeps what ends at the last commit frame
before that point. Damage to one frame therefore drops every transaction after it, and damage
to the header drops the whole log, without an error: acknowledged writes vanish.

What is normal and must still open:

* a torn last frame (the process was killed mid-write): nothing committed follows it;
* frames of an older generation after the current ones (the log restarts from the top with new
  salts and is not truncated): their salts differ;
* frames of transactions that never committed after the last commit (a rolled-back write that
  spilled to the log, or one cut short by a crash): the next transaction overwrites from the
  last commit with the same salts, so the old frames behind it fail the chained checksum while
  keeping the current salts. They never end in a commit frame of their own, because a
  transaction whose commit frame was written is committed and is never overwritten.

So a log is refused only when, after the point where SQLite would stop, a commit frame of the
current generation follows whose checksum verifies when chained from the stored checksum of the
frame before it (or from what that frame's checksum should have been, in case it was the stored
checksum that was hit): a committed transaction that SQLite would drop. A damaged header is
refused when a whole frame follows it.

Cost: after SQLite's first read, its wal-index header (the ``-shm`` file, ``read_wal_index``)
says where it stopped, so only the commit frames after that point are checksummed: an intact
log costs a parse of its frame headers. Without it every frame is checksummed, as SQLite's
recovery does; the checksum is a linear recurrence, so each frame's contribution is a dot
product computed apart (with numpy for a long log) and only the chaining is a loop over frames.
"""
from __future__ import annotations

import operator
import struct
import sys
from dataclasses import dataclass

__all__ = ["FRAME_HEADER", "WAL_HEADER", "WalReport", "check_wal", "checksum", "read_wal_index"]

WAL_HEADER = 32
FRAME_HEADER = 24
_MAGIC_LE, _MAGIC_BE = 0x377F0682, 0x377F0683  # the low bit says how checksums read words
_VERSION = 3007000
_MASK = 0xFFFFFFFF
_CHUNK = 256  # frames checksummed per batch: bounds memory on a large log
_NUMPY_FROM = 64  # frames from which numpy is worth importing (when nothing imported it yet)


@dataclass(frozen=True, slots=True)
class WalReport:
    """What SQLite would make of a WAL file."""

    frames: int  # whole frames in the file, of any generation
    valid: int  # frames SQLite reads: the valid prefix
    committed: int  # frames up to the last commit frame of that prefix: what SQLite applies
    problem: str | None  # why opening would lose committed transactions, else None


def checksum(data: bytes, s0: int, s1: int, big_endian: bool) -> tuple[int, int]:
    """SQLite's WAL checksum of ``data`` (a multiple of 8 bytes), continuing from (s0, s1).
    The plain form: the reference the vectorised one is tested against."""
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & _MASK
        s1 = (s1 + words[i + 1] + s0) & _MASK
    return s0, s1


def _powers(n: int) -> list[tuple[int, int, int, int]]:
    """M^m for m = 0..n, M = [[1, 1], [1, 2]] (one checksum step on (s0, s1)), mod 2^32."""
    out = []
    a, b, c, d = 1, 0, 0, 1
    for _ in range(n + 1):
        out.append((a, b, c, d))
        a, b, c, d = (a + c) & _MASK, (b + d) & _MASK, (a + 2 * c) & _MASK, (b + 2 * d) & _MASK
    return out


class _Summer:
    """Checksums of many equal-length chunks: state_n = M^n state_0 + sum_k M^(n-k) u_k, with
    u_k = (a_k, a_k + b_k) for the k-th word pair (a_k, b_k). The sum does not depend on the
    state, so it is a dot product per chunk: numpy for many frames (uint64 arithmetic wraps
    modulo 2^64, which keeps every value right modulo 2^32), plain Python for a few, so that
    opening a file with a short log does not pay for importing numpy."""

    def __init__(self, pairs: int, big_endian: bool) -> None:
        powers = _powers(pairs)
        self.total = powers[pairs]  # M^n, applied to the incoming state
        rev = powers[pairs - 1::-1] if pairs else []  # M^(n-k) for k = 1..n
        # c0 = sum a_k (r00 + r01) + b_k r01 ; c1 = sum a_k (r10 + r11) + b_k r11
        self.weights = ([(p[0] + p[1]) & _MASK for p in rev], [p[1] for p in rev],
                        [(p[2] + p[3]) & _MASK for p in rev], [p[3] for p in rev])
        self.big_endian = big_endian
        self.pairs = pairs
        self._np: tuple = ()

    def contributions(self, rows: list[bytes], use_numpy: bool) -> list[tuple[int, int]]:
        return self._numpy(rows) if use_numpy else [self._python(row) for row in rows]

    def _python(self, row: bytes) -> tuple[int, int]:
        words = struct.unpack(f"{'>' if self.big_endian else '<'}{2 * self.pairs}I", row)
        a, b = words[0::2], words[1::2]
        wa0, wb0, wa1, wb1 = self.weights
        return ((sum(map(operator.mul, a, wa0)) + sum(map(operator.mul, b, wb0))) & _MASK,
                (sum(map(operator.mul, a, wa1)) + sum(map(operator.mul, b, wb1))) & _MASK)

    def _numpy(self, rows: list[bytes]) -> list[tuple[int, int]]:
        import numpy as np  # only for a long log: most opens never import it

        if not self._np:
            self._np = tuple(np.array(w, dtype=np.uint64) for w in self.weights)
        dtype = np.dtype(">u4" if self.big_endian else "<u4")
        words = np.frombuffer(b"".join(rows), dtype=dtype).astype(np.uint64).reshape(len(rows), self.pairs, 2)
        a, b = words[:, :, 0], words[:, :, 1]
        wa0, wb0, wa1, wb1 = self._np
        with np.errstate(over="ignore"):
            c0 = (a * wa0 + b * wb0).sum(axis=1) & _MASK
            c1 = (a * wa1 + b * wb1).sum(axis=1) & _MASK
        return [(int(x), int(y)) for x, y in zip(c0, c1)]

    def chain(self, state: tuple[int, int], contribution: tuple[int, int]) -> tuple[int, int]:
        t00, t01, t10, t11 = self.total
        s0, s1 = state
        return ((t00 * s0 + t01 * s1 + contribution[0]) & _MASK,
                (t10 * s0 + t11 * s1 + contribution[1]) & _MASK)


def _page_size(value: int) -> int | None:
    if value == 1:
        value = 65536  # as in the database header
    if 512 <= value <= 65536 and value & (value - 1) == 0:
        return value
    return None


class _Frames:
    """The frames of one log generation: headers parsed up front, checksum contributions
    computed when first asked for (all at once for a full walk, one by one for a few)."""

    def __init__(self, data: bytes, page: int, big: bool, salts: tuple[int, int], start: tuple[int, int]) -> None:
        self.data, self.size = data, FRAME_HEADER + page
        self.count = (len(data) - WAL_HEADER) // self.size
        self.summer = _Summer((8 + page) // 8, big)
        unpack = struct.Struct(">6I").unpack_from
        self.heads = [unpack(data, WAL_HEADER + i * self.size) for i in range(self.count)]
        self.salts, self.start = salts, start
        self._contrib: dict[int, tuple[int, int]] = {}

    def _row(self, i: int) -> bytes:
        at = WAL_HEADER + i * self.size
        return self.data[at:at + 8] + self.data[at + FRAME_HEADER:at + self.size]

    def compute_all(self) -> None:
        use_numpy = self.count >= _NUMPY_FROM or "numpy" in sys.modules
        for first in range(0, self.count, _CHUNK):
            todo = range(first, min(self.count, first + _CHUNK))
            for i, c in zip(todo, self.summer.contributions([self._row(i) for i in todo], use_numpy)):
                self._contrib[i] = c

    def contrib(self, i: int) -> tuple[int, int]:
        if i not in self._contrib:
            self._contrib[i] = self.summer.contributions([self._row(i)], False)[0]
        return self._contrib[i]

    # Frames are 0-based here; the stored checksum "before" frame 0 is the header's.
    def stored(self, i: int) -> tuple[int, int]:
        return self.start if i < 0 else (self.heads[i][4], self.heads[i][5])

    def ours(self, i: int) -> bool:
        pgno, _size, f1, f2, _c0, _c1 = self.heads[i]
        return (f1, f2) == self.salts and pgno != 0  # SQLite reads no frame of page 0

    def commits(self, i: int) -> bool:
        return self.heads[i][1] != 0

    def follows(self, i: int, state: tuple[int, int]) -> bool:
        return self.ours(i) and self.summer.chain(state, self.contrib(i)) == self.stored(i)

    def chains(self, i: int) -> bool:
        """Frame i verifies from the stored checksum of the frame before it, or from what that
        one should have been (when it was the stored checksum that was hit)."""
        if self.follows(i, self.stored(i - 1)):
            return True
        return i >= 1 and self.follows(i, self.summer.chain(self.stored(i - 2), self.contrib(i - 1)))


def read_wal_index(shm: bytes) -> tuple[int, bytes] | None:
    """What SQLite recovered from the log, from its wal-index header (the ``-shm`` file, in
    native byte order: https://www.sqlite.org/walformat.html): the last frame it applies
    (mxFrame) and the log's 8 salt bytes; None when the header is not a valid one."""
    if len(shm) < 96 or shm[:48] != shm[48:96]:  # SQLite keeps two copies
        return None
    version, _unused, _change, is_init, _big, _page, mx_frame = struct.unpack_from("=IIIBBHI", shm, 0)
    if version != _VERSION or not is_init:
        return None
    if checksum(shm[:40], 0, 0, sys.byteorder == "big") != struct.unpack_from("=II", shm, 40):
        return None
    return mx_frame, shm[32:40]


def check_wal(data: bytes, page_size: int | None = None, recovered: tuple[int, bytes] | None = None) -> WalReport:
    """Read a WAL file's bytes as SQLite would and say whether committed transactions would be
    dropped. ``page_size`` (the database's, when known) sizes frames behind a damaged header.

    ``recovered`` is what SQLite itself kept (``read_wal_index`` after its first read): then
    only the commit frames after that point are checksummed, so an intact log costs a parse of
    its frame headers; without it every frame is (the same answer, at the cost of hashing)."""
    if len(data) < WAL_HEADER:
        # Shorter than the header, which SQLite writes in one piece: no frame can follow.
        return WalReport(0, 0, 0, None)
    magic, version, raw_page, _ckpt, salt1, salt2, h0, h1 = struct.unpack(">8I", data[:WAL_HEADER])
    big = magic == _MAGIC_BE
    wal_page = _page_size(raw_page)
    header_ok = (magic in (_MAGIC_LE, _MAGIC_BE) and version == _VERSION and wal_page is not None
                 and checksum(data[:24], 0, 0, big) == (h0, h1))
    if not header_ok:
        count = (len(data) - WAL_HEADER) // (FRAME_HEADER + (page_size or wal_page or 512))
        problem = None
        if count:
            problem = (f"its header is damaged while {count} frame{'s' if count != 1 else ''} follow it, "
                       "which SQLite would ignore")
        return WalReport(count, 0, 0, problem)
    assert wal_page is not None
    frames = _Frames(data, wal_page, big, (salt1, salt2), (h0, h1))
    count = frames.count
    if recovered is not None and recovered[1] == data[16:24] and recovered[0] <= count:
        valid = committed = recovered[0]  # SQLite's mxFrame: always a commit frame (or 0)
    else:  # walk the chain as SQLite's recovery does
        frames.compute_all()
        valid = committed = 0
        state = frames.stored(-1)
        while valid < count and frames.follows(valid, state):
            state = frames.stored(valid)
            valid += 1
            if frames.commits(valid - 1):
                committed = valid
    lost = [i + 1 for i in range(committed, count)
            if i + 1 > valid and frames.ours(i) and frames.commits(i) and frames.chains(i)]
    problem = None
    if lost:
        first = committed  # the first frame SQLite does not follow (0-based), for the message
        state = frames.stored(first - 1)
        while first < count and frames.follows(first, state):
            state = frames.stored(first)
            first += 1
        problem = (f"frame {first + 1} of {count} fails its checksum, and {len(lost)} committed "
                   f"transaction{'s' if len(lost) != 1 else ''} after it would be silently dropped")
    return WalReport(count, valid, committed, problem)
