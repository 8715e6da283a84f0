"""What a failed write or read of the storage file says: one line naming the file, what
happened, whether anything of it is stored, and what to do (from SQLite's error code, and for an
I/O error the disk's free space and the process's file size limit)."""
from __future__ import annotations

import os
import resource
import sqlite3

from memmesh.crdt.errors import DamagedError, DiskFullError, DiskIOError, ReadOnlyError, StorageError, WriteFailedError

_LARGEST_WRITE = 65536 + 24  # one WAL frame of the largest page size
_NEARLY_FULL = 1 << 20  # free bytes below which an I/O error is taken for a full disk


def write_error(exc: sqlite3.Error, path: str, nothing: str = "nothing was written") -> StorageError:
    """One line for a write that did not commit, from SQLite's error code: which file, what
    happened, that nothing of it is stored (``nothing``), what to do."""
    name = getattr(exc, "sqlite_errorname", None) or ""
    if name == "SQLITE_FULL":
        return DiskFullError(f"the disk holding {path} is full: {nothing}; free space and retry")
    if name.startswith("SQLITE_IOERR"):
        # A full disk reaches SQLite as ENOSPC (SQLITE_FULL) on most writes, but a file size
        # limit gives EFBIG and some file systems report no space as EIO: look for both.
        limit = _file_size_limit_reached(path)
        if limit is not None:
            return DiskFullError(f"{path} reached this process's file size limit ({limit:,} bytes, "
                                 f"ulimit -f): {nothing}; raise the limit and retry")
        if _disk_nearly_full(path):
            return DiskFullError(f"the disk holding {path} is full: {nothing}; free space and retry")
        return DiskIOError(f"writing {path} failed with an I/O error ({name}): {nothing}; check the disk "
                           "and the system log, then retry")
    if name == "SQLITE_READONLY_DBMOVED":
        return ReadOnlyError(f"{path} was moved or deleted while memmesh had it open: {nothing}; "
                             "put it back, or restart memmesh")
    if name.startswith("SQLITE_READONLY"):
        return ReadOnlyError(f"{path} cannot be written by this process ({name}): {nothing}; make the file, "
                             "its directory and its file system writable for this user, then retry")
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return DamagedError(f"{path} is damaged ({exc}): {nothing}; run memmesh check --repair, "
                            "or restore a backup")
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return WriteFailedError(f"{path} is locked by another process ({name}): {nothing}; retry once it "
                                "is done")
    if name.startswith("SQLITE_CANTOPEN"):
        return WriteFailedError(f"cannot open a file beside {path} (its write-ahead log; {exc}): {nothing}; "
                                "check the permissions of its directory and the free space, then retry")
    if name == "SQLITE_NOMEM":
        return WriteFailedError(f"out of memory while writing {path}: {nothing}; retry")
    return StorageError(f"writing {path} failed ({name or type(exc).__name__}: {exc}): {nothing}")


def read_error(exc: sqlite3.Error, path: str) -> StorageError:
    """One line for a read of ``path`` that failed, from SQLite's error code."""
    name = getattr(exc, "sqlite_errorname", None) or ""
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return DamagedError(f"{path} is damaged: reading it failed ({exc}); run memmesh check --repair, "
                            "or restore a backup")
    if name.startswith("SQLITE_IOERR"):
        return StorageError(f"reading {path} failed with an I/O error ({name}); check the disk and "
                            "the system log")
    return StorageError(f"reading {path} failed ({name or type(exc).__name__}: {exc})")


def _file_size_limit_reached(path: str) -> int | None:
    """This process's file size limit (RLIMIT_FSIZE) when ``path`` or its WAL has reached it."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft == resource.RLIM_INFINITY:
        return None
    for name in (path, path + "-wal", path + "-journal"):
        try:
            size = os.path.getsize(name)
        except OSError:
            continue
        if size + _LARGEST_WRITE > soft:
            return soft
    return None


def _disk_nearly_full(path: str) -> bool:
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < _NEARLY_FULL
