"""View snapshots: a memory view's built state kept in a file, so opening a node does not
rebuild every view from the log (docs/memory.md, "Indexes and costs"; docs/operations.md,
"View snapshots").

What a snapshot is
    One file per (database, embeddings store, vector length) under the home's ``views/``
    directory: a header (JSON: format, the code fingerprint, the database, the store, the
    length, how many docs), the view's state (BM25 postings and statistics, vectors, per-row
    columns, timelines, the rows themselves as columns) and, inside that state, exactly which
    entries' rows it reflects, per store. A SHA-256 of everything before it closes the file.

Never trusted
    A snapshot is used only when every check passes: the digest (a damaged or cut file fails
    it), the format and the code fingerprint (a hash of the sources that decide what a view
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
    none) and a temporary file that the next opening removes.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pickle
import struct
import sys
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

__all__ = ["FORMAT", "MIN_DOCS", "VIEWS_DIR", "SnapshotRejected", "Snapshots", "code_fingerprint"]

log = logging.getLogger(__name__)

FORMAT = 1
VIEWS_DIR = "views"  # under the home: the snapshot files
MAGIC = b"MMVIEW1\n"
MIN_DOCS = 2000  # a smaller view rebuilds in well under a second: no file for it
MAX_HEADER = 64 * 1024
_DIGEST = 32
_LEN = struct.Struct("<I")
_TMP = ".tmp."

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


class _Hashing:
    """A file that hashes what is written to it."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self.sha = hashlib.sha256()

    def write(self, data: Any) -> int:
        self.sha.update(data)
        return self._f.write(data)


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
    def write(self, meta: Meta, dump: Callable[[IO[bytes]], None]) -> Path:
        """Write a snapshot: ``dump`` writes the state (pickle) to the file it is given."""
        if self.read_only:
            raise PermissionError("these view snapshots are read only")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.sweep()
        path = self.path_for(meta.db, meta.store, meta.dim)
        # Two threads may write the same view's file (a view closed over the budget writes its
        # own while the periodic round writes its successor's): each its own temporary file.
        tmp = path.with_name(f"{path.name}{_TMP}{os.getpid()}.{uuid.uuid4().hex[:12]}")
        header = json.dumps({"format": FORMAT, "code": code_fingerprint(), "db": meta.db, "store": meta.store,
                             "dim": meta.dim, "docs": meta.docs}, sort_keys=True).encode()
        try:
            with open(tmp, "wb") as f:
                out = _Hashing(f)
                out.write(MAGIC)
                out.write(_LEN.pack(len(header)))
                out.write(header)
                dump(out)  # type: ignore[arg-type]  # a file-like writer is all pickle needs
                f.write(out.sha.digest())
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
        """What a snapshot file says it is (its header only: the digest is not checked here);
        SnapshotRejected when the header cannot be read."""
        try:
            with open(path, "rb") as f:
                head = f.read(len(MAGIC) + _LEN.size)
                if len(head) < len(MAGIC) + _LEN.size or head[: len(MAGIC)] != MAGIC:
                    raise SnapshotRejected("not a view snapshot (damaged or cut short)")
                (hlen,) = _LEN.unpack_from(head, len(MAGIC))
                if hlen > MAX_HEADER:
                    raise SnapshotRejected("damaged header")
                header = json.loads(f.read(hlen))
        except OSError as exc:
            raise SnapshotRejected(f"cannot be read ({exc.strerror or exc})") from None
        except ValueError:
            raise SnapshotRejected("damaged header") from None
        if not isinstance(header, dict):
            raise SnapshotRejected("damaged header")
        db, store, dim, docs = (header.get(k) for k in ("db", "store", "dim", "docs"))
        if (not isinstance(db, str) or not (store is None or isinstance(store, str))
                or not (dim is None or type(dim) is int) or type(docs) is not int):
            raise SnapshotRejected("damaged header")
        return Meta(db, store, dim, docs)

    def read(self, db_id: str, store: str | None, dim: int | None) -> Any:
        """The state a snapshot holds; SnapshotRejected (with the reason) when there is none or
        any check fails."""
        self.sweep()
        path = self.path_for(db_id, store, dim)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise SnapshotRejected("no snapshot") from None
        except OSError as exc:
            raise SnapshotRejected(f"cannot be read ({exc.strerror or exc})") from None
        view = memoryview(data)
        if len(data) < len(MAGIC) + _LEN.size + _DIGEST or data[: len(MAGIC)] != MAGIC:
            raise SnapshotRejected("not a view snapshot (damaged or cut short)")
        if hashlib.sha256(view[:-_DIGEST]).digest() != data[-_DIGEST:]:
            raise SnapshotRejected("damaged (its digest does not match its content)")
        (hlen,) = _LEN.unpack_from(data, len(MAGIC))
        start = len(MAGIC) + _LEN.size
        if hlen > MAX_HEADER or start + hlen > len(data) - _DIGEST:
            raise SnapshotRejected("damaged header")
        try:
            header = json.loads(bytes(view[start : start + hlen]))
        except ValueError:
            raise SnapshotRejected("damaged header") from None
        if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("code") != code_fingerprint():
            raise SnapshotRejected("written by another version of memmesh")
        if (header.get("db"), header.get("store"), header.get("dim")) != (db_id, store, dim):
            raise SnapshotRejected("of another database or embeddings store")
        try:
            return pickle.loads(view[start + hlen : -_DIGEST])
        except Exception as exc:  # the digest matched: only a bug of the writer gets here
            raise SnapshotRejected(f"cannot be decoded ({type(exc).__name__})") from None


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


def dump_state(state: Any, out: IO[bytes]) -> None:
    pickle.Pickler(out, protocol=5).dump(state)
