"""backup and restore: a consistent copy of the whole home, itself a home (docs/operations.md).

backup: the copy is taken on the node that holds the home (through serve when it runs), so it
needs no second writer: SQLite's online backup copies the storage file as one snapshot, then the
key files, config.yaml and the API token are copied beside it with the same 0600 modes. A backup
directory is a complete home (`memmesh --home DEST status` reads it) and holds the private keys
in the clear.

restore: a *standalone* command (like mcp): it acts on the home's path and never opens the home
as a node. That is the point of it: the home it replaces may be damaged beyond opening, and
opening it would take the home's lock and start a writer where nothing may write. It refuses
while any process holds the home (serve, or a command), checks the backup by opening a copy of
it, builds the new home in a directory beside the target and renames it into place, so the
target is either the old home or the complete restored one, never a mix. With --force an old
home is moved aside (never deleted). Before the rename, every database of the copy that another
node may hold gets a write fence (node/fence.py): its agents may have written after the backup,
and a write before those entries are back would be equivocation.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import Field, field_validator

from memmesh.auth.errors import MemmeshError
from memmesh.crdt.clock import now_ms
from memmesh.crdt.errors import DamagedError
from memmesh.crdt.storage import Storage
from memmesh.node.commands.params import Cli, Params
from memmesh.node.commands.registry import command
from memmesh.node.commands.result import Result
from memmesh.node.home import KEYS_DIR, LOCK_FILE, PEER_KEY, STORAGE_FILE

if TYPE_CHECKING:
    from memmesh.node.library import Node

# Besides the storage file and keys/: what a home holds that a restore needs.
SIDE_FILES = ("config.yaml", "api.token")


class BackupError(MemmeshError):
    """The backup could not be written; the destination is left as it was, or removed."""


# Printed by both commands: a backup is as secret as the keys it holds.
KEYS_IN_THE_CLEAR = ("the backup holds this node's private keys unencrypted: keep it as you keep the keys "
                     "(readable by you only; encrypted if it leaves this machine)")


class RestoreError(MemmeshError):
    """The restore was refused or failed; the home is left as it was."""


def _absolute(value: str) -> str:
    # The CLI makes a relative path absolute where the user stands; another caller (the HTTP
    # API) must say where it means, since serve's working directory is nobody's business.
    if not os.path.isabs(value):
        raise ValueError(f"should be an absolute path (got {value!r})")
    return value


class Backup(Params):
    dest: Annotated[str, Cli(positional=True, metavar="DIR", path=True), Field(
        description="a directory that does not exist yet (or is empty): it becomes a copy of the home")]

    @field_validator("dest")
    @classmethod
    def _dest_absolute(cls, value: str) -> str:
        return _absolute(value)


class Restore(Params):
    src: Annotated[str, Cli(positional=True, metavar="SRC", path=True), Field(
        description="a directory written by memmesh backup (it holds private keys in the clear)")]
    force: Annotated[bool, Field(
        description="replace a home that is there: it is moved aside to HOME.replaced-<UTC time>, never deleted")] = False

    @field_validator("src")
    @classmethod
    def _src_absolute(cls, value: str) -> str:
        return _absolute(value)


@command("backup", Backup, "copy the whole home (storage, keys, config) to a new directory, consistently")
def backup(node: Node, p: Backup) -> Result:
    dest = Path(p.dest)
    home = Path(node.home).absolute()
    if dest.absolute() == home or home in dest.absolute().parents:
        raise BackupError(f"{dest} is inside the home {home}; back up to a directory outside it")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BackupError(f"{dest} exists and is not an empty directory; name a new one")
    created = not dest.exists()
    try:
        dest.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(dest, 0o700)  # it holds private keys
        node.storage.backup_to(dest / STORAGE_FILE)
        os.chmod(dest / STORAGE_FILE, 0o600)
        keys, side = _copy_keys_and_side_files(home, dest)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True) if created else _empty(dest)
        raise
    size = (dest / STORAGE_FILE).stat().st_size
    data = {"dest": str(dest), "databases": len(node.database_ids()), "keys": len(keys), "bytes": size,
            "files": [STORAGE_FILE, *(f"{KEYS_DIR}/{f.name}" for f in keys), *side]}
    return Result(data, f"backed up {home} to {dest}: {data['databases']} databases, {len(keys)} keys, "
                        f"{size:,} bytes of storage\n"
                        f"restore: memmesh --home HOME restore {dest} (with serve stopped), then start "
                        "serve and let it sync before agents write (docs/operations.md)\n"
                        f"{KEYS_IN_THE_CLEAR}")


def _copy_private(src: Path, dst: Path) -> None:
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out, open(src, "rb") as f:
        shutil.copyfileobj(f, out)
        out.flush()
        os.fsync(out.fileno())


def _copy_keys_and_side_files(src: Path, dest: Path) -> tuple[list[Path], list[str]]:
    """Copy keys/ and the side files of home ``src`` into ``dest`` (0700 / 0600); returns the
    key files (their paths in ``src``) and the side files' names."""
    (dest / KEYS_DIR).mkdir(mode=0o700)
    keys = sorted(f for f in (src / KEYS_DIR).iterdir() if f.is_file())
    for f in keys:
        _copy_private(f, dest / KEYS_DIR / f.name)
    side = [name for name in SIDE_FILES if (src / name).is_file()]
    for name in side:
        _copy_private(src / name, dest / name)
    return keys, side


def _empty(d: Path) -> None:
    for child in d.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()


# ---------------------------------------------------------------------------------- restore
@command("restore", Restore, "put a backup in place as the home (while no serve runs); the backup holds "
                             "private keys in the clear", standalone=True)
def restore(home: Path, p: Restore) -> Result:
    src, home = Path(p.src), Path(home).absolute()
    _check_places(src, home)
    if not (src / STORAGE_FILE).is_file() or not (src / KEYS_DIR / PEER_KEY).is_file():
        raise RestoreError(f"{src} is not a memmesh backup (it lacks {STORAGE_FILE} or {KEYS_DIR}/{PEER_KEY}); "
                           "name a directory written by memmesh backup")
    holder = _holder(src)
    if holder is not None:
        raise RestoreError(f"{src} is a home in use by process {holder}, not a backup: take one with "
                           f"memmesh --home {src} backup DIR, and restore that")
    with _held(home) as occupied:
        if occupied and not p.force:
            raise RestoreError(f"{home} is not empty; nothing was changed. Restore into a new directory, or add "
                               f"--force to move what is there aside to {home.name}.replaced-<UTC time> "
                               "(it is not deleted)")
        home.parent.mkdir(parents=True, exist_ok=True)
        # Beside the home, so that the final rename stays on one file system (atomic).
        staging = Path(tempfile.mkdtemp(prefix=f".{home.name}.restoring-", dir=home.parent))
        aside: Path | None = None
        try:
            found = _copy_backup(src, staging)
            if occupied:
                aside = _aside_name(home)
                os.rename(home, aside)
            os.rename(staging, home)  # onto a missing or empty directory: atomic
            _fsync_dir(home.parent)
        except BaseException:
            if aside is not None and not home.exists():
                os.rename(aside, home)  # the old home goes back where it was
                aside = None
            shutil.rmtree(staging, ignore_errors=True)
            raise
    data = {"home": str(home), "src": str(src), **found, "moved_aside": str(aside) if aside else None}
    lines = [f"restored {src} into {home}: {found['databases']} databases, {found['keys']} keys, "
             f"{found['bytes']:,} bytes of storage"]
    if aside is not None:
        lines.append(f"the home that was there is now {aside} (nothing of it was deleted)")
    fenced = found["fenced"]
    if fenced:
        lines.append(f"fenced {len(fenced)} database{'s' if len(fenced) != 1 else ''} that peers may hold "
                     f"({', '.join(fenced)}): local writes to them are refused until a sync with a peer brings "
                     "back what this node's keys signed after the backup (memmesh unfence NAME lifts it by hand)")
    lines += [
        f"next: start serve (memmesh --home {home} serve) and let it sync with its peers before any agent "
        f"writes (memmesh --home {home} sync syncs at once). Entries written after the backup come back from "
        "the peers that hold them; an agent that "
        "writes before its own later entries are back signs a second entry where it already wrote one, and "
        "peers then stop taking that agent's writes (equivocation)",
        "not restored: entries written after the backup that no peer holds (banks not shared, or not synced "
        "yet), agents, banks and keys created after it, peers and shares added after it, and this node's "
        "own records since then (access counts, refusals, sync status)",
        KEYS_IN_THE_CLEAR,
    ]
    return Result(data, "\n".join(lines))


def _check_places(src: Path, home: Path) -> None:
    if not src.is_dir():
        raise RestoreError(f"{src} is not a directory; name a directory written by memmesh backup")
    src, target = src.resolve(), home.resolve()
    if src == target or src in target.parents or target in src.parents:
        raise RestoreError(f"{src} and the home {home} overlap; restore a backup kept outside the home "
                           "into a home outside the backup")
    if home.exists() and not home.is_dir():
        raise RestoreError(f"{home} exists and is not a directory; name a directory for the home")


def _holder(home: Path) -> str | None:
    from memmesh.node.control import lock_holder  # light: the control client, no node

    return lock_holder(home)


@contextlib.contextmanager
def _held(home: Path) -> Iterator[bool]:
    """Hold the home's lock for the body, refusing if anyone has it (serve, a command); yields
    whether the home holds anything (False: missing or an empty directory)."""
    from memmesh.node.control import read_info

    if not home.exists():
        yield False
        return
    occupied = any(home.iterdir())
    try:
        fd = os.open(home / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        yield occupied  # never opened as a home: nothing can be running there
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
            info = read_info(home) or {}
            if str(info.get("pid")) == holder:
                raise RestoreError(f"serve is running for {home} (pid {holder}); stop it (kill -TERM {holder}), "
                                   "then restore") from None
            raise RestoreError(f"{home} is in use by process {holder}; let it finish, or stop it, then restore") \
                from None
        yield occupied
    finally:
        os.close(fd)


def _aside_name(home: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = home.with_name(f"{home.name}.replaced-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = home.with_name(f"{home.name}.replaced-{stamp}-{n}")
    return aside


def _copy_backup(src: Path, dest: Path) -> dict:
    """Copy the backup's files into ``dest`` (0700 directories, 0600 files, flushed to disk),
    then open the copy to check it is a home: the storage file as memmesh opens it and passes
    SQLite's integrity check, every key file loads. The backup itself is only read."""
    from memmesh.node.keystore import load_key
    from memmesh.node.storage import SqliteStorage

    os.chmod(dest, 0o700)
    # A backup that was itself opened as a home may hold committed pages in its WAL: copy it
    # too (never the shared-memory index, which SQLite rebuilds); the check below folds it in.
    for name in (STORAGE_FILE, STORAGE_FILE + "-wal"):
        if (src / name).is_file():
            _copy_private(src / name, dest / name)
    keys, side = _copy_keys_and_side_files(src, dest)
    try:
        own = {f.name: str(load_key(dest / KEYS_DIR / f.name).public) for f in keys if f.suffix == ".key"}
        storage = SqliteStorage(dest / STORAGE_FILE)  # what opening the home will do, on the copy
        try:
            databases = len(storage.databases())
            fenced = _fence(storage, own[PEER_KEY], set(own.values()))
        finally:
            storage.close()  # checkpoints the WAL into the file and removes it
    except DamagedError as exc:
        # What it found, not its advice (check --repair is for a home, not for a backup); the
        # message names the copy, the user knows the backup by its own path.
        found = str(exc).replace(str(dest), str(src)).split(";")[0]
        raise RestoreError(f"cannot restore {src}: {found}; nothing was changed: restore another backup") from None
    except MemmeshError as exc:
        raise RestoreError(f"cannot restore {src}: {str(exc).replace(str(dest), str(src))}; "
                           "nothing was changed") from None
    try:
        conn = sqlite3.connect(dest / STORAGE_FILE)
        try:
            problems = [row[0] for row in conn.execute("PRAGMA integrity_check(5)")]
        finally:
            conn.close()
    except sqlite3.Error as exc:
        problems = [str(exc)]
    if problems != ["ok"]:
        raise RestoreError(f"{src / STORAGE_FILE} is damaged ({'; '.join(problems)}); nothing was changed: "
                           "restore another backup")
    for d in (dest / KEYS_DIR, dest):
        _fsync_dir(d)
    return {"databases": databases, "keys": len(keys), "bytes": (dest / STORAGE_FILE).stat().st_size,
            "files": [STORAGE_FILE, *(f"{KEYS_DIR}/{f.name}" for f in keys), *side], "fenced": fenced}


def _fence(storage: Storage, peer_key: str, own: set[str]) -> list[str]:
    """Fence every database of the copy that another node may hold (node/fence.py): its agents
    may have written after the backup, and peers may hold those entries. The names (or ids)
    of the databases fenced, all in one transaction of peer-local records."""
    from memmesh.crdt.database import Database
    from memmesh.node import fence
    from memmesh.node.registry import Registry
    from memmesh.node.sync.state import SyncState

    sync = SyncState(storage, peer_key)
    registry = Registry(storage)
    names = {r.db_id: r.name for r in registry.agents()} | {r.db_id: r.name for r in registry.banks()}
    t = now_ms()
    new = []
    for db_id in storage.databases():
        db: Database | None = None
        if not (sync.is_shared(db_id) or sync.peers.peers(db_id) or sync.links(db_id)):
            # Only then is the log read: its settings say whether a key of another node is granted.
            # Unreadable: fenced, to be safe (memmesh check says what is wrong with it).
            with contextlib.suppress(MemmeshError):
                db = Database.open(storage, db_id)
        if fence.held_elsewhere(sync, db_id, db, own):
            new.append(fence.Fence(db_id, fence.RESTORE, t, sorted(own)))
    fence.set_many(storage, new)
    return sorted(names.get(f.db, f.db) for f in new)


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
