"""What a storage file's first bytes say before SQLite reads it, and the lines that say why a
storage file cannot be opened (sans-IO; node/storage.py opens, node/wal_check.py reads the WAL).

SQLite's own errors do not tell a damaged memmesh file from another program's file ("file is
not a database" for both), nor a truncated file from an overwritten one ("database disk image
is malformed"), and they name no file. The database header
(https://www.sqlite.org/fileformat.html#the_database_header) does: the 16-byte magic string,
the page size, and the size in pages, which is valid when the version-valid-for number equals
the change counter. The owner of a damaged memmesh file is told to repair or restore it; the
owner of another program's file to choose another path; nobody to throw data away.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from memmesh.crdt.errors import DamagedError, StorageError

__all__ = [
    "HEADER", "Header", "check_length", "clean", "damaged", "not_sqlite", "open_error", "other_program", "read_header",
    "truncated",
]

HEADER = 100  # bytes of the database header
_MAGIC = b"SQLite format 3\x00"
_FIX = "run: memmesh check --repair, or restore a backup (memmesh restore)"


@dataclass(frozen=True, slots=True)
class Header:
    page_size: int
    pages: int | None  # the size in pages the header records, when it is valid


def damaged(path: str, what: str) -> DamagedError:
    return DamagedError(f"{path} is damaged ({what}); {_FIX}")


def truncated(path: str, what: str) -> DamagedError:
    return DamagedError(f"{path} is truncated ({what}); {_FIX}")


def not_sqlite(path: str, what: str = "its first bytes are not SQLite's header") -> DamagedError:
    # Either way nothing in it can be read; a DamagedError, because in a memmesh home it is one.
    return DamagedError(
        f"{path} is not a readable SQLite file ({what}): if it is this node's storage, it is damaged: "
        "restore a backup (memmesh restore); if it is another program's file, move it away or choose "
        "another path (memmesh creates its storage file itself)"
    )


def other_program(path: str) -> StorageError:
    return StorageError(
        f"{path} is an SQLite database of another program, not a memmesh storage file; move it away or "
        "choose another path (memmesh creates its storage file itself)"
    )


def _pages(n: int) -> str:
    return f"{n:,} page{'s' if n != 1 else ''}"


def read_header(path: str, head: bytes, size: int) -> Header | None:
    """The header of a file of ``size`` bytes whose first bytes are ``head``; None for an empty
    file (a new storage). Raises the one-line error when the bytes cannot be an intact SQLite
    file. The size in pages is not compared with the file here: a write-ahead log may hold
    pages beyond the file's end (the caller compares when it has none)."""
    if size == 0:
        return None
    if not head.startswith(_MAGIC):
        if size < len(_MAGIC) and _MAGIC.startswith(head):
            raise truncated(path, f"it ends after {size} bytes, inside SQLite's header")
        raise not_sqlite(path)
    if size < HEADER:
        raise truncated(path, f"it ends after {size} bytes, inside SQLite's {HEADER}-byte header")
    raw_page = struct.unpack(">H", head[16:18])[0]
    page_size = 65536 if raw_page == 1 else raw_page
    if page_size < 512 or page_size & (page_size - 1):
        raise damaged(path, f"its header gives an impossible page size, {raw_page}")
    (change, pages), (valid_for,) = struct.unpack_from(">II", head, 24), struct.unpack_from(">I", head, 92)
    if size < page_size:
        raise truncated(path, f"it ends after {size:,} bytes, inside its first page of {page_size:,} bytes")
    return Header(page_size, pages if pages and change == valid_for else None)


def check_length(path: str, header: Header, size: int) -> None:
    """Raise when the file is shorter than its header says (call it when no write-ahead log
    holds pages of its own)."""
    whole, part = divmod(size, header.page_size)
    if header.pages is not None and whole < header.pages:
        raise truncated(path, f"its header says {_pages(header.pages)} of {header.page_size:,} bytes, "
                              f"the file holds {whole:,}{' and a part' if part else ''}")
    if header.pages is None and part:
        raise truncated(path, f"it ends {part:,} bytes into a page of {header.page_size:,} bytes")


def clean(text: object, limit: int = 200) -> str:
    """``text`` fit for one line: SQLite's messages can quote damaged bytes (a schema's SQL)."""
    s = "".join(c if c.isprintable() else "?" for c in str(text))
    return s if len(s) <= limit else s[:limit] + "..."


def open_error(path: str, exc: BaseException) -> StorageError:
    """The line for an exception raised while SQLite opens ``path`` (or while decoding what it
    returns): damage says what to do about damage; the rest say which file and why."""
    name = getattr(exc, "sqlite_errorname", None) or ""
    if name.startswith("SQLITE_CORRUPT") or not name:  # no SQLite code: decoding damaged bytes failed
        return damaged(path, f"SQLite: {clean(exc)}" if name else f"SQLite returns unreadable data: {clean(exc)}")
    if name == "SQLITE_NOTADB":  # the magic string was intact (checked first): another header field is not
        return damaged(path, f"its header is damaged; SQLite: {clean(exc)}")
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return StorageError(f"{path} is locked by another process ({name}); let it finish, or stop it, and try again")
    if name.startswith("SQLITE_IOERR"):
        return StorageError(f"reading {path} failed with an I/O error ({name}); check the disk and the system log")
    return StorageError(f"cannot open storage file {path}: {clean(exc)}")
