"""View snapshots: a memory view's built state kept in a file, so opening a node does not
rebuild every view from the log (docs/memory.md, "Indexes and costs"; docs/operations.md,
"View snapshots").

What a snapshot is
    One file per (database, embeddings store, vector length) under the home's ``views/``
    directory: the view's state (BM25 postings and statistics, vectors, per-row columns,
    timelines, the rows themselves as columns, and exactly which entries' rows it reflects, per
    store) as a pickle whose large arrays follow it as raw bytes (protocol 5, out of band), each
    starting on a page of the file, then a header (JSON: format, the code fingerprint, the
    database, the store, the length, how many docs, the sizes of the parts, the CRC-32 of the
    pickle), its length, and a CRC-32 of everything before it. Checksums against damage, not a
    signature: the file is this node's own, in a directory only its owner writes, as the keys.

Never trusted
    A snapshot is used only when every check passes: the sizes and the CRC-32 (a damaged or cut
    file fails them), the format and the code fingerprint (a hash of the sources that decide what a view
    holds, node/memory/ and the row decoding in crdt/: another release, or any change to that
    code, means another fingerprint), the database, store and length; then the reader
    (node/memory/view_feed.py) checks that every entry it reflects still shows its rows now (a
    revocation that voided some, an erasure, an equivocation: the snapshot is dropped and the
    view rebuilt from the log) and applies the rows of the entries it does not reflect, as a
    view fed row by row would. What the view then shows is what a rebuild shows
    (``memmesh check`` compares the two, tests/test_view_snapshots.py too).

Writing
    The state is serialised under the view's lock (writes arriving meanwhile wait in the view's
    queue and are applied after), to a temporary file in the same directory, flushed to disk,
    then renamed over the old one: a process killed while writing leaves the old snapshot (or
    none) and a temporary file that the next opening removes. A file is never changed in place
    (a new one is renamed over it, ``check --repair`` and the user remove it), which is what
    makes mapping it safe.

Reading
    The file is mapped copy-on-write: its arrays are its pages, not copies (a view's float32
    vectors, of which a quantised search reads only its candidates' rows, then cost memory only
    where they are read; a write to an array copies just the pages it touches). The pickle's
    CRC-32 is checked before it is read; the whole file's on another thread, by reads that do not
    touch the mapping, while the pickle is read, and before anything it made is used.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import mmap
import os
import pickle
import struct
import sys
import threading
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

__all__ = ["FORMAT", "MIN_DOCS", "VIEWS_DIR", "SnapshotRejected", "Snapshots", "code_fingerprint"]

log = logging.getLogger(__name__)

FORMAT = 3
VIEWS_DIR = "views"  # under the home: the snapshot files
MAGIC = b"MMVIEW3\n"
MIN_DOCS = 2000  # a smaller view rebuilds in well under a second: no file for it
MAX_HEADER = 1 << 20  # the header lists each out-of-band array's size
_TAIL = struct.Struct("<II")  # the header's length, the CRC-32
_TMP = ".tmp."
_CHUNK = 1 << 24  # bytes read or checked at a time
ALIGN = 4096  # each array starts on a page of the file

# The code whose change changes what a view holds for the same rows: the view and its indexes,
# the row parsing and labels (node/memory), and the row decoding (crdt). A snapshot written by
# other code is never read.
_CODE_PACKAGES = ("memmesh.node.memory",)
_CODE_FILES = (("memmesh.crdt", "yjs.py"), ("memmesh.crdt", "records.py"))


class SnapshotRejected(Exception):
    """Why a snapshot file is not used (the view is then rebuilt from the log)."""


def _sources() -> Iterable[tuple[str, bytes]]:
    from importlib import resources

    for package in _CODE_PACKAGES:
        root = resources.files(package)
        for item in sorted(root.iterdir(), key=lambda p: p.name):
            if item.name.endswith(".py"):
                yield f"{package}/{item.name}", item.read_bytes()
    for package, name in _CODE_FILES:
        yield f"{package}/{name}", resources.files(package).joinpath(name).read_bytes()


_fingerprint: str | None = None


def code_fingerprint() -> str:
    """SHA-256 over the sources that decide a view's content, the snapshot format, and the
    Python and numpy versions (their pickles of the state)."""
    global _fingerprint
    if _fingerprint is None:
        h = hashlib.sha256()
        h.update(f"format {FORMAT}; python {sys.version_info[:2]}; numpy {np.__version__}\n".encode())
        for name, data in _sources():
            h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
        _fingerprint = h.hexdigest()
    return _fingerprint


@dataclass(frozen=True)
class Meta:
    """What a snapshot file says it is."""

    db: str
    store: str | None
    dim: int | None
    docs: int


class _Summing:
    """A file that keeps the CRC-32 and the count of what is written to it."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self.crc = 0
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)
        self.size += view.nbytes
        return self._f.write(view)


def _trailer(f: IO[bytes], size: int) -> tuple[dict[str, Any], bytes, int]:
    """(header, the header's bytes and length field, the CRC-32) from the end of a file."""
    if size < len(MAGIC) + _TAIL.size:
        raise SnapshotRejected("not a view snapshot (damaged or cut short)")
    f.seek(size - _TAIL.size)
    tail = f.read(_TAIL.size)
    hlen, crc = _TAIL.unpack(tail)
    if hlen > MAX_HEADER or hlen > size - len(MAGIC) - _TAIL.size:
        raise SnapshotRejected("damaged header")
    f.seek(size - _TAIL.size - hlen)
    raw = f.read(hlen)
    try:
        header = json.loads(raw)
    except ValueError:
        raise SnapshotRejected("damaged header") from None
    if not isinstance(header, dict):
        raise SnapshotRejected("damaged header")
    return header, raw + tail[:4], crc


class Snapshots:
    """The snapshot files of one home (``<home>/views``)."""

    def __init__(self, directory: Path, *, min_docs: int = MIN_DOCS, read_only: bool = False) -> None:
        """``read_only``: never write, drop or sweep a file (``memmesh check`` reads them)."""
        self.directory = directory
        self.min_docs = min_docs
        self.read_only = read_only
        self._swept = False

    def path_for(self, db_id: str, store: str | None, dim: int | None) -> Path:
        name = hashlib.sha256(f"{db_id}\0{store}\0{dim}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
        return self.directory / f"{name}.view"

    def files(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.iterdir() if p.suffix == ".view")

    def sweep(self) -> None:
        """Remove temporary files left by a process that died while writing (one process
        writes a home at a time, so any other process's file is a dead one's)."""
        if self._swept or self.read_only or not self.directory.is_dir():
            return
        self._swept = True
        mine = f"{_TMP}{os.getpid()}."
        for p in self.directory.iterdir():
            if _TMP in p.name and mine not in p.name:
                with contextlib.suppress(OSError):
                    p.unlink()

    # ------------------------------------------------------------------ writing
    def write(self, meta: Meta, state: Any) -> Path:
        """Write a snapshot of ``state`` (what :meth:`read` gives back)."""
        if self.read_only:
            raise PermissionError("these view snapshots are read only")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.sweep()
        path = self.path_for(meta.db, meta.store, meta.dim)
        # Two threads may write the same view's file (a view closed over the budget writes its
        # own while the periodic round writes its successor's): each its own temporary file.
        tmp = path.with_name(f"{path.name}{_TMP}{os.getpid()}.{uuid.uuid4().hex[:12]}")
        try:
            with open(tmp, "wb") as f:
                out = _Summing(f)
                out.write(MAGIC)
                arrays: list[pickle.PickleBuffer] = []
                pickle.Pickler(out, protocol=5, buffer_callback=arrays.append).dump(state)
                stream = out.size - len(MAGIC)
                stream_crc = out.crc
                sizes = []
                for buf in arrays:
                    raw = buf.raw()
                    sizes.append(raw.nbytes)
                    out.write(bytes(-out.size % ALIGN))  # each array starts on a page: mapped in place
                    out.write(raw)
                header = json.dumps({"format": FORMAT, "code": code_fingerprint(), "db": meta.db, "store": meta.store,
                                     "dim": meta.dim, "docs": meta.docs, "stream": stream, "stream_crc": stream_crc,
                                     "arrays": sizes}, sort_keys=True).encode()
                out.write(header)
                out.write(_TAIL.pack(len(header), 0)[:4])
                f.write(struct.pack("<I", out.crc))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        _fsync_dir(self.directory)
        return path

    def drop(self, db_id: str, store: str | None, dim: int | None) -> bool:
        if self.read_only:
            return False
        try:
            self.path_for(db_id, store, dim).unlink()
            return True
        except FileNotFoundError:
            return False

    # ------------------------------------------------------------------ reading
    @staticmethod
    def meta(path: Path) -> Meta:
        """What a snapshot file says it is (its header only: the checksum is not checked here);
        SnapshotRejected when the header cannot be read."""
        try:
            with open(path, "rb") as f:
                if f.read(len(MAGIC)) != MAGIC:
                    raise SnapshotRejected("not a view snapshot (damaged, cut short, or of another format)")
                header, _raw, _crc = _trailer(f, os.fstat(f.fileno()).st_size)
        except OSError as exc:
            raise SnapshotRejected(f"cannot be read ({exc.strerror or exc})") from None
        db, store, dim, docs = (header.get(k) for k in ("db", "store", "dim", "docs"))
        if (not isinstance(db, str) or not (store is None or isinstance(store, str))
                or not (dim is None or type(dim) is int) or type(docs) is not int):
            raise SnapshotRejected("damaged header")
        return Meta(db, store, dim, docs)

    def read(self, db_id: str, store: str | None, dim: int | None) -> Any:
        """The state a snapshot holds; SnapshotRejected (with the reason) when there is none or
        any check fails. Its arrays are the file's pages, mapped copy-on-write (module
        docstring, "Reading")."""
        self.sweep()
        path = self.path_for(db_id, store, dim)
        try:
            with open(path, "rb") as f:
                return _read(f, db_id, store, dim)
        except FileNotFoundError:
            raise SnapshotRejected("no snapshot") from None
        except OSError as exc:
            raise SnapshotRejected(f"cannot be read ({exc.strerror or exc})") from None


def _read(f: io.BufferedReader, db_id: str, store: str | None, dim: int | None) -> Any:
    size = os.fstat(f.fileno()).st_size
    if f.read(len(MAGIC)) != MAGIC:
        raise SnapshotRejected("not a view snapshot (damaged, cut short, or of another format)")
    header, raw, crc = _trailer(f, size)
    if header.get("format") != FORMAT or header.get("code") != code_fingerprint():
        raise SnapshotRejected("written by another version of memmesh")
    if (header.get("db"), header.get("store"), header.get("dim")) != (db_id, store, dim):
        raise SnapshotRejected("of another database or embeddings store")
    spans = _spans(header, size - len(raw) - 4)
    mapped = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    whole = memoryview(mapped)
    stream_end = len(MAGIC) + header["stream"]
    # The pickle is checked before it is read; the rest of the file (the arrays, the header) is
    # checked on another thread while it is (zlib and the reads let go of the GIL), and before
    # anything it made is used.
    if zlib.crc32(whole[:stream_end]) != header.get("stream_crc"):
        raise SnapshotRejected("damaged (its checksum does not match its content)")
    rest = _Checksum(f.fileno(), header["stream_crc"], stream_end, size - 4, raw)
    rest.start()
    state: Any = None
    undecodable: Exception | None = None
    try:
        state = pickle.loads(whole[len(MAGIC):stream_end], buffers=[whole[a:b] for a, b in spans])
    except Exception as exc:  # its checksum matched: only a bug of the writer gets here
        undecodable = exc
    finally:
        rest.join()
    # Damage is the reason whenever the file has it, whatever else went wrong.
    if rest.error is not None:
        raise SnapshotRejected(f"cannot be read ({rest.error})")
    if rest.crc != crc:
        raise SnapshotRejected("damaged (its checksum does not match its content)")
    if undecodable is not None:
        raise SnapshotRejected(f"cannot be decoded ({type(undecodable).__name__})")
    return state


def _spans(header: dict[str, Any], end: int) -> list[tuple[int, int]]:
    """Where each array lies in the file (page-aligned, in order); SnapshotRejected when the
    header's sizes do not add up to the file's."""
    stream, sizes = header.get("stream"), header.get("arrays")
    if (type(stream) is not int or type(header.get("stream_crc")) is not int or not isinstance(sizes, list)
            or not all(type(n) is int and n >= 0 for n in sizes) or stream < 0):
        raise SnapshotRejected("damaged (its parts do not add up to its size)")
    at = len(MAGIC) + stream
    spans = []
    for n in sizes:
        at += -at % ALIGN
        spans.append((at, at + n))
        at += n
    if at != end:
        raise SnapshotRejected("damaged (its parts do not add up to its size)")
    return spans


class _Checksum(threading.Thread):
    """The CRC-32 of a file's bytes [start, end) followed by ``tail``, continuing ``crc``; read
    with pread a chunk at a time (the mapping's pages are not touched, so they count towards
    the process's memory only where the view reads them)."""

    def __init__(self, fd: int, crc: int, start: int, end: int, tail: bytes) -> None:
        super().__init__(name="snapshot-checksum", daemon=True)
        self._fd = os.dup(fd)
        self.crc, self._start, self._end, self._tail = crc, start, end - len(tail), tail
        self.error: str | None = None

    def run(self) -> None:
        try:
            buf = bytearray(min(_CHUNK, max(1, self._end - self._start)))
            view = memoryview(buf)
            at, crc = self._start, self.crc
            while at < self._end:
                got = os.preadv(self._fd, [view[: min(len(buf), self._end - at)]], at)
                if got <= 0:
                    raise OSError("the file was cut short while it was read")
                crc = zlib.crc32(view[:got], crc)
                at += got
            self.crc = zlib.crc32(self._tail, crc)
        except OSError as exc:
            self.error = exc.strerror or str(exc)
        finally:
            os.close(self._fd)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

