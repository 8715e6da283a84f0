"""The node's home directory: its storage, its keys, the databases it hosts.

Layout (docs/architecture.md):
    HOME/node.sqlite      the SQLite storage: signed logs, pending entries, peer-local data
    HOME/keys/peer.key    the node's peer key (0600); agent and bank keys live beside it
    HOME/api.token        the local HTTP API's bearer token (0600; node/api_token.py)

Nothing of a home is readable by another user: directories 0700, files 0600, whatever the
umask (``make_private``, run by init and serve; the storage file is created 0600 and SQLite
gives its -wal and -shm files its mode).

A home that lost its peer key or its storage file is refused with one line (``check_files``),
never initialised again: a new peer key would make it another node to every peer.
"""
from __future__ import annotations

import fcntl
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memmesh.auth.errors import MemmeshError
from memmesh.auth.keys import SigningKey
from memmesh.crdt.database import Database
from memmesh.crdt.errors import DamagedError
from memmesh.node.api_token import create_token
from memmesh.node.keystore import KeyStoreError, load_key, save_key
from memmesh.node.registry import Registry
from memmesh.node.storage import SqliteStorage

STORAGE_FILE = "node.sqlite"
KEYS_DIR = "keys"
PEER_KEY = "peer.key"


class HomeNotPrivate(MemmeshError):
    """The home is writable by other users: what it holds may not be ours any more."""


PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600
# Secrets are never made private behind the user's back: a key or token that others could read
# may have been copied already, so they are refused with the chmod to run, as their loaders do
# (the user then decides whether to replace them).
SECRETS = ("api.token",)


def make_private(home: Path | str) -> list[str]:
    """Make the home and everything in it readable by its owner alone: every directory 0700,
    every file 0600 (symbolic links are not followed). Returns what was changed, as
    ``NAME (MODE)`` relative to the home, for the one line init and serve print.

    Refuses a home that its group or others may write: another user could have put or replaced
    files in it, which no chmod undoes. A key file or the API token readable by others is
    refused with the chmod to run, not fixed (``SECRETS``)."""
    home = Path(home)
    st = check_owner(home)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "group and others" if st.st_mode & stat.S_IWGRP and st.st_mode & stat.S_IWOTH \
            else "its group" if st.st_mode & stat.S_IWGRP else "others"
        raise HomeNotPrivate(f"{home} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}), so another user "
                             f"could have replaced what it holds; check it, then run: chmod go-w {home}")
    changed: list[str] = []

    def fix(path: Path, want: int, mode: int) -> None:
        if stat.S_IMODE(mode) & 0o077:
            # The home itself may be a symbolic link to the directory (check_owner vouched for both).
            os.chmod(path, want, follow_symlinks=path == home)
            changed.append(f"{path.relative_to(home).as_posix() if path != home else 'the home'} "
                           f"({stat.S_IMODE(mode):o})")

    fix(home, PRIVATE_DIR, st.st_mode)
    for root, dirs, files in os.walk(home):
        base = Path(root)
        for name in dirs + files:
            path = base / name
            try:
                lst = os.lstat(path)
            except FileNotFoundError:  # gone meanwhile (a temporary file)
                continue
            mode = lst.st_mode
            if stat.S_ISLNK(mode):
                continue
            if stat.S_ISDIR(mode):
                if lst.st_uid != os.geteuid():
                    raise HomeNotPrivate(_not_yours(path, lst.st_uid))
                fix(path, PRIVATE_DIR, mode)
            elif (name in SECRETS and base == home) or (base.name == KEYS_DIR and name.endswith(".key")):
                if stat.S_IMODE(mode) & 0o077:
                    raise KeyStoreError(f"{'key' if name.endswith('.key') else 'API token'} file {path} is readable "
                                        f"by other users (mode {stat.S_IMODE(mode):o}); run: chmod 600 {path}")
            else:
                fix(path, PRIVATE_FILE, mode)
    return changed


def check_owner(home: Path | str) -> os.stat_result:
    """The home directory's status, after refusing a home that another user could swap out
    from under us: one owned by another user (made beforehand in a shared directory such as
    /tmp, its owner can rename keys/ or serve.sock and put its own in their place), a symbolic
    link another user owns (its owner can point it elsewhere), or one whose parent directory
    others may write without the sticky bit (they can rename the home itself)."""
    home = Path(home)
    lst = os.lstat(home)
    if stat.S_ISLNK(lst.st_mode) and lst.st_uid not in (os.geteuid(), 0):
        raise HomeNotPrivate(f"{home} is a symbolic link owned by {_user(lst.st_uid)}, who can point it elsewhere; "
                             f"use the directory it names, or a link of your own")
    st = os.stat(home)
    if not stat.S_ISDIR(st.st_mode):
        raise HomeNotPrivate(f"{home} is not a directory; a home is a directory of its own")
    if st.st_uid != os.geteuid():
        raise HomeNotPrivate(_not_yours(home, st.st_uid))
    check_parent(home)
    return st


def check_parent(home: Path | str) -> None:
    """Refuse a home (existing or to be made) in a directory others may write without the
    sticky bit: they could rename the home and put their own in its place."""
    parent_path = Path(os.path.realpath(home)).parent
    parent = os.stat(parent_path)
    if parent.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not parent.st_mode & stat.S_ISVTX:
        raise HomeNotPrivate(f"{home} is in {parent_path}, which other users may write (mode "
                             f"{stat.S_IMODE(parent.st_mode):04o}, no sticky bit), so they could replace the home "
                             f"itself; put it in a directory of your own")


def _not_yours(path: Path, uid: int) -> str:
    return (f"{path} is owned by {_user(uid)}, not by you ({_user(os.geteuid())}), so its owner could replace what "
            f"it holds; use a home of your own (or run memmesh as its owner)")


def _user(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def private_line(home: Path | str, changed: list[str]) -> str:
    """The one line that says what ``make_private`` changed."""
    shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    return (f"made {home} private: other users could read {shown}; "
            f"now directories are 700 and files 600")


class HomeNotADirectory(MemmeshError):
    """The home's path, or a folder on it, is a file."""


def check_is_directory(home: Path) -> None:
    """Refuse a home whose path is a file, or passes through one, naming that file (the
    system's own words, "File exists" or "Not a directory", do not say which path is wrong)."""
    for path in (home, *home.parents):
        if path.exists():
            if path.is_dir():
                return
            if path == home:
                raise HomeNotADirectory(f"{home} is a file, not a directory: a home is a directory; "
                                        "name another path for it")
            raise HomeNotADirectory(f"{path} is a file, not a directory, so the home {home} cannot be made "
                                    "in it; name another path for the home")


class NotInitialised(MemmeshError):
    """The home has no node yet."""


class HomeBusy(MemmeshError):
    """Another process has this home open."""


LOCK_FILE = "node.lock"
DEFAULT_LOCK_TIMEOUT = 30.0


def flock_within(fd: int, timeout: float, poll_s: float = 0.05) -> bool:
    """Take an exclusive flock on ``fd``, waiting up to ``timeout`` seconds; False if it stayed
    held (polled: a blocking flock could not be given up at a deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)


def _lock_home(home: Path, timeout: float) -> int:
    """Take the home's exclusive lock, waiting up to ``timeout`` seconds.

    One key writes from one place: two processes writing with the same agent key would each
    sign the next entry of its feed, and two different entries at one (author, seq) are
    equivocation, which stops the key's writes everywhere. So one process at a time opens a
    home; the lock goes away with the process, however it ends.
    """
    fd = os.open(home / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    if not flock_within(fd, timeout):
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise HomeBusy(
            f"{home} is in use by process {holder} (waited {timeout:g} s); "
            "let it finish, or stop it, and try again"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


class Home:
    """One peer's home: its storage, keys, registries and hosted databases."""

    def __init__(self, home: Path, storage: SqliteStorage, peer_key: SigningKey, lock_fd: int | None = None) -> None:
        self.home = home
        self.storage = storage
        self.peer_key = peer_key
        self._lock_fd = lock_fd
        self.registry = Registry(storage)
        self._databases: dict[str, Database] = {}
        self._open_listeners: list[Callable[[Database], None]] = []
        self.created = False  # True when this opening created the node (init reports it)
        self.made_private: list[str] = []  # what init made private (make_private), for its line

    # ------------------------------------------------------------------ lifecycle
    @staticmethod
    def is_initialised(home: Path | str) -> bool:
        return (Path(home) / KEYS_DIR / PEER_KEY).exists()

    @staticmethod
    def check_files(home: Path | str) -> None:
        """Refuse a home that lost its peer key or its storage (one line: which file, what to do).

        Without this, a home whose keys/peer.key was lost would be initialised again with a new
        peer key (another node, to every peer), and one whose node.sqlite was lost or emptied
        would open as a new, empty node beside its agents' keys."""
        home = Path(home)
        keys = home / KEYS_DIR
        storage = home / STORAGE_FILE
        others = sorted(p.name for p in keys.glob("*.key") if p.name != PEER_KEY) if keys.is_dir() else []
        stored = storage.is_file() and storage.stat().st_size > 0
        if not (keys / PEER_KEY).exists():
            if stored or others:
                holds = f"{storage}" if stored else f"the keys {', '.join(others[:3])}"
                raise KeyStoreError(
                    f"key file {keys / PEER_KEY} is missing, but {home} holds a node ({holds}): the node's identity "
                    "is gone, and a new key would make it another node; restore keys/peer.key from a backup "
                    "(memmesh backup copies keys/)"
                )
        elif others and not stored:
            raise DamagedError(
                f"{storage} is {'empty' if storage.is_file() else 'missing'}, but {keys} holds this node's keys "
                f"({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}): the node's data is gone; "
                "restore a backup (memmesh restore)"
            )

    @classmethod
    def init(cls, home: Path | str) -> tuple[Home, bool]:
        """Create the node in ``home`` if it is new; returns (node, created)."""
        home = Path(home)
        check_is_directory(home)
        cls.check_files(home)
        created = not cls.is_initialised(home)
        # Before anything is written: a home others may write is refused, one they may read fixed.
        fixed = make_private(home) if home.is_dir() else []
        if created:
            if not home.is_dir() and Path(os.path.realpath(home)).parent.is_dir():
                check_parent(home)  # before anything is made
            home.mkdir(parents=True, exist_ok=True, mode=0o700)  # the home holds keys and the control socket
            save_key(home / KEYS_DIR / PEER_KEY, SigningKey.generate())
            create_token(home)  # the local HTTP API's bearer token (0600)
        node = cls.open(home)
        node.created = created
        try:
            node.made_private = fixed + [c for c in make_private(home) if c not in fixed]
        except BaseException:
            node.close()
            raise
        return node, created

    @classmethod
    def open(cls, home: Path | str, *, create: bool = True, lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> Home:
        home = Path(home)
        cls.check_files(home)
        if not cls.is_initialised(home):
            if create:
                return cls.init(home)[0]
            check_is_directory(home)
            raise NotInitialised(f"no memmesh node in {home}; run: memmesh --home {home} init")
        check_owner(home)  # one stat or two: a home another user could swap is never opened
        lock_fd = _lock_home(home, lock_timeout)
        try:
            cls.check_files(home)  # again under the lock: the files may have changed while it waited
            peer_key = load_key(home / KEYS_DIR / PEER_KEY)
            storage = SqliteStorage(home / STORAGE_FILE)
        except BaseException:
            os.close(lock_fd)
            raise
        return cls(home, storage, peer_key, lock_fd)

    def verify(self) -> None:
        """Check the whole home as serve does before it starts: every key file loads, SQLite's
        quick_check of the storage file, then every database opened (each stored entry hashed
        against its id, node/storage.py and crdt/database.py). Raises the one-line error of
        the first problem. quick_check reads the whole file (about 110 ms at 100k entries), so
        a one-shot command does not run it; docs/architecture.md, "Opening a damaged home"."""
        for path in sorted((self.home / KEYS_DIR).glob("*.key")):
            load_key(path)
        self.storage.quick_check()
        for db_id in self.database_ids():
            self.database(db_id)

    def close(self) -> None:
        self._databases.clear()
        self.storage.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = None

    def __enter__(self) -> Home:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ keys
    def key_path(self, name: str) -> Path:
        return self.home / KEYS_DIR / f"{name}.key"

    def new_key(self, name: str) -> SigningKey:
        key = SigningKey.generate()
        save_key(self.key_path(name), key)
        return key

    def save_key(self, name: str, key: SigningKey) -> None:
        save_key(self.key_path(name), key)

    def load_key(self, name: str) -> SigningKey:
        return load_key(self.key_path(name))

    def load_creator_key(self, name: str, db: Database) -> SigningKey:
        """The key in keys/NAME.key, which signed ``db``'s root (an agent's own database). A key
        file has no checksum: one changed character can still decode, to another key, which
        would make the agent someone else; its database says whose key it must be."""
        key = self.load_key(name)
        root = db.entry(db.id)
        if root is not None and root.author_key != str(key.public):
            raise KeyStoreError(
                f"key file {self.key_path(name)} is damaged: it holds another key than the one that created "
                f"database {db.id[:19]}...; restore it from a backup (memmesh backup copies keys/)"
            )
        return key

    # ------------------------------------------------------------------ databases
    def database_ids(self) -> list[str]:
        return self.storage.databases()

    def database(self, db_id: str) -> Database:
        db = self._databases.get(db_id)
        if db is None:
            db = self._databases[db_id] = Database.open(self.storage, db_id)
            self._opened(db)
        return db

    def adopt(self, staged: Database) -> Database:
        """This node's database of ``staged``, whose entries were just appended to this node's
        storage, in its order: ``Database.adopt`` takes the index and derived state staged
        built as it checked them, where ``database`` would read and hash the whole log back and
        derive everything again. The caller drops
        ``staged``; the adopted database is cached and announced as an opened one is."""
        if staged.id in self._databases:
            raise MemmeshError(f"database {staged.id} is open on this node already")
        db = self._databases[staged.id] = Database.adopt(self.storage, staged)
        self._opened(db)
        return db

    def on_open(self, listener: Callable[[Database], None]) -> Callable[[], None]:
        """Call ``listener(db)`` for every database open now and each one opened or created from
        now on (serve's event stream watches them all); returns a function that removes it."""
        self._open_listeners.append(listener)
        for db in list(self._databases.values()):
            listener(db)
        return lambda: self._open_listeners.remove(listener) if listener in self._open_listeners else None

    def _opened(self, db: Database) -> None:
        for listener in list(self._open_listeners):
            listener(db)

    def create_database(self, admin: SigningKey, meta: dict[str, Any]) -> Database:
        db = Database.create(self.storage, admin, meta=meta)
        self._databases[db.id] = db
        self._opened(db)
        return db
