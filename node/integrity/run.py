"""`memmesh check [--repair]`: verify a home, and heal it from peers.

Two ways in:

* ``check_home(home, repair=...)``: the home's path, with no process holding it open (the
  command without serve). It takes the home's lock itself and never relies on the normal
  open, which refuses a damaged home: the storage file is read through a read-only snapshot
  (check) or, for a repair, rebuilt first when SQLite itself finds it damaged (salvage.py).
* ``check_open(node)``: verify only, on a node that is open (serve). It reads a snapshot of
  the storage on a connection of its own, on a worker thread, so serve goes on answering.

A repair, per database: damaged entries (and the intact ones that descend from them) are
moved to the damaged area, payloads that fail their digest become "not received", the derived
state is rebuilt by opening the database (which also erases what accepted erases cover), the
missing entries are fetched from the peers that share the database (the `sync` command's own
code path, node/sync/oneshot.py), and the orphans whose past came back are applied again
through the normal pipeline. What no peer gave back is reported as lost.
"""
from __future__ import annotations

import asyncio
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memmesh.crdt.clock import now_ms
from memmesh.crdt.entry import decode_entry
from memmesh.crdt.errors import MemmeshError, StorageError
from memmesh.crdt.storage import Storage, StoredEntry
from memmesh.node.integrity.entries import Rebuilt, Verified, intact_copy, rebuild, sound_order, verify
from memmesh.node.integrity.keys import KeyCheck, Named, registry_records
from memmesh.node.integrity.report import DatabaseRepair, DatabaseReport, Lost, Problem, Report, StorageReport
from memmesh.node.integrity.salvage import SalvageError, salvage
from memmesh.node.integrity.views import SnapshotFiles, check_views, snapshot_files
from memmesh.node.storage import APPLICATION_ID, SCHEMA_VERSION, SqliteStorage

if TYPE_CHECKING:
    from memmesh.node.core_node import CoreNode
    from memmesh.node.sync.host import SyncHost

EventSink = Callable[[dict[str, Any]], None]
STORAGE_FILE = "node.sqlite"  # node.home.STORAGE_FILE
SOURCE = "check"  # the source label of what a repair applies again
REAPPLY_BATCH = 2000  # orphans per ingest when they go back into the log


class CheckRefused(MemmeshError):
    """`memmesh check` cannot run as asked (a repair while the home is open elsewhere)."""


class _Unreadable(Exception):
    """A repair met rows SQLite's own check passed but that cannot be read: rebuild the file."""


# What reading a damaged file can raise beyond StorageError: text that is not UTF-8 any more
# (UnicodeDecodeError is a ValueError), values of the wrong type where bytes were stored.
_UNREADABLE = (StorageError, ValueError, TypeError)


@dataclass
class _Found:
    found: Verified
    rebuilt: Rebuilt
    report: DatabaseReport

    @property
    def repair(self) -> DatabaseRepair:
        """What the repair did to this database: set for every database before any healing."""
        assert self.report.repair is not None
        return self.report.repair


# ----------------------------------------------------------------------------- entry points


def check_home(home: Path | str, *, repair: bool = False, events: EventSink | None = None,
               lock_timeout: float | None = None) -> Report:
    """Check (``repair``: and heal) the home at ``home``; see the module docstring."""
    from memmesh.node.home import DEFAULT_LOCK_TIMEOUT, KEYS_DIR, PEER_KEY, NotInitialised, _lock_home

    home = Path(home)
    path = home / STORAGE_FILE
    if not path.exists() and not (home / KEYS_DIR / PEER_KEY).exists():
        raise NotInitialised(f"no memmesh node in {home}; run: memmesh --home {home} init")
    started = time.monotonic()
    lock_fd: int | None = _lock_home(home, DEFAULT_LOCK_TIMEOUT if lock_timeout is None else lock_timeout)
    storage: SqliteStorage | None = None
    report = Report(str(home), repair, StorageReport(str(path)))
    try:
        keys = KeyCheck(home)
        storage = _open_storage(path, report, repair)
        if storage is None:
            report.keys, report.keys_checked = keys.problems, keys.checked
            return report
        try:
            found = _check_storage(home, storage, report, keys, events, repair)
        except _Unreadable as exc:
            # Nothing was moved yet (every database is read before anything moves): rebuild the
            # file, and start over on it.
            storage.close()
            storage = None
            report.databases, report.local = [], []
            report.storage.problems.append(Problem("sqlite.unreadable", str(exc)))
            keys = KeyCheck(home)
            storage = _salvage_and_open(path, report)
            if storage is None:
                report.keys, report.keys_checked = keys.problems, keys.checked
                return report
            found = _check_storage(home, storage, report, keys, events, repair)
        if repair:
            node = _heal(home, storage, keys, lock_fd, found, report, events)
            storage, lock_fd = None, None  # the node owns them now
            node.close()
        return report
    finally:
        if storage is not None:
            storage.close()
        if lock_fd is not None:
            os.close(lock_fd)
        report.seconds = time.monotonic() - started


def check_open(node: SyncHost, *, events: EventSink | None = None) -> Report:
    """Verify a home that ``node`` holds open (serve): a snapshot of its storage, read on a
    worker thread, so that the database thread goes on serving while the check runs."""
    home = Path(node.home)
    path = Path(getattr(node.storage, "path", home / STORAGE_FILE))

    def work() -> Report:
        started = time.monotonic()
        report = Report(str(home), False, StorageReport(str(path)))
        keys = KeyCheck(home)
        snapshot = _open_storage(path, report, repair=False)
        try:
            if snapshot is not None:
                _check_storage(home, snapshot, report, keys, events, repair=False)
            else:
                report.keys, report.keys_checked = keys.problems, keys.checked
        finally:
            if snapshot is not None:
                snapshot.close()
        report.seconds = time.monotonic() - started
        return report

    if node.network.serving:
        return node.network.run(lambda run: asyncio.to_thread(work))
    return work()


# ----------------------------------------------------------------------------- the file


def _file_header(path: Path) -> tuple[int, int]:
    """(application_id, user_version) as SQLite reads them; raises sqlite3.Error."""
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    try:
        conn.execute("PRAGMA writable_schema=ON")  # the header only: a damaged schema row must not hide it
        return conn.execute("PRAGMA application_id").fetchone()[0], conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        conn.close()


SQLITE_MAGIC = b"SQLite format 3\x00"  # the first bytes of every SQLite file


def _header_gone(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC


def _open_storage(path: Path, report: Report, repair: bool) -> SqliteStorage | None:
    """The storage to check: a snapshot (check) or the file itself, rebuilt first when SQLite
    finds it damaged (repair). None when nothing more can be checked (said in ``report``)."""
    problems = report.storage.problems
    if not path.exists():
        problems.append(Problem("sqlite.unreadable", f"{path} is missing: restore a backup (memmesh restore)",
                                repairable=False))
        return None
    try:
        app_id, version = _file_header(path)
    except sqlite3.Error as exc:
        app_id, version = APPLICATION_ID, None
        if _header_gone(path):  # SQLite opens nothing without it, and a salvage reads no row
            problems.append(Problem("sqlite.unreadable", f"{path} cannot be read as an SQLite file: its first "
                                    "bytes are not SQLite's header", repairable=False))
        else:
            problems.append(Problem("sqlite.unreadable", f"{path} cannot be read as an SQLite file ({exc})"))
    report.storage.schema_version = version
    if app_id not in (APPLICATION_ID, 0):
        raise StorageError(f"{path} is not a memmesh storage file (its SQLite header names another program); "
                           "memmesh check does not touch it: if it is this node's storage, restore a backup")
    if version is not None and version > SCHEMA_VERSION:
        raise StorageError(f"{path} was written by a newer memmesh (storage schema version {version}; this "
                           f"version understands up to {SCHEMA_VERSION}); upgrade memmesh to check it")
    snapshot: SqliteStorage | None = None
    if not problems:
        try:
            snapshot = SqliteStorage.open_snapshot(path)
            problems += [Problem("sqlite.integrity", line) for line in snapshot.integrity_problems()]
            problems += [Problem("sqlite.schema", line) for line in snapshot.schema_problems()]
        except StorageError as exc:
            problems.append(Problem("sqlite.unreadable", str(exc)))
    if not repair:
        if snapshot is not None and any(p.code == "sqlite.unreadable" for p in problems):
            snapshot.close()
            return None
        if snapshot is None:
            return None
        for p in problems:  # what the repair would do about it
            p.detail += " (memmesh check --repair rebuilds the file from every row that can be read)"
        return snapshot
    if snapshot is not None:
        snapshot.close()
    if problems:
        return _salvage_and_open(path, report)
    try:
        return SqliteStorage(path)
    except StorageError as exc:
        # SQLite reads it, memmesh's open refuses it (a damaged schema row, a write-ahead log
        # that would drop transactions): rebuild it from what can be read all the same.
        problems.append(Problem("sqlite.unreadable", str(exc)))
        return _salvage_and_open(path, report)


def _salvage_and_open(path: Path, report: Report) -> SqliteStorage | None:
    problems = report.storage.problems
    try:
        report.storage.salvaged = salvage(path).as_dict()
    except (SalvageError, OSError) as exc:
        problems.append(Problem("sqlite.unreadable", str(exc)))
        return None
    try:
        return SqliteStorage(path)
    except StorageError as exc:
        problems.append(Problem("sqlite.unreadable", f"the rebuilt file does not open either: {exc}"))
        return None


# ----------------------------------------------------------------------------- the databases


def _check_storage(home: Path, storage: SqliteStorage, report: Report, keys: KeyCheck, events: EventSink | None,
                   repair: bool) -> dict[str, _Found]:
    known = storage.databases()
    try:
        named, local_problems = registry_records(storage, set(known))
    except _UNREADABLE as exc:
        if repair and report.storage.salvaged is None:
            raise _Unreadable(f"the peer-local records cannot be read: {exc}") from exc
        named, local_problems = [], [Problem("local.damaged", f"the peer-local records cannot be read: {exc}")]
    report.local = local_problems
    names: dict[str, Named] = {}
    for record in named:
        names.setdefault(record.db_id, record)
    out: dict[str, _Found] = {}
    snapshots = snapshot_files(home)
    report.stray_views = _stray_views(snapshots, set(known), repair)
    for db_id in known:
        rec = names.get(db_id)
        label = rec.name if rec else db_id[:20]

        def progress(done: int, total: int, label: str = label) -> None:
            if events is not None:
                events({"event": "progress", "bank": f"check {label}", "done": done, "total": total, "unit": "entry"})

        try:
            found = verify(storage, db_id, progress)
        except _UNREADABLE as exc:  # a page the integrity check named, or text that is not text
            if repair and report.storage.salvaged is None:
                raise _Unreadable(f"database {db_id} cannot be read: {exc}") from exc
            report.databases.append(DatabaseReport(db_id, rec.name if rec else db_id, rec.kind if rec else "",
                                                   problems=[Problem("sqlite.unreadable", str(exc))]))
            continue
        rebuilt = rebuild(storage, found)
        name = rec.name if rec else _display_name(rebuilt) or db_id
        d = DatabaseReport(db_id, name, rec.kind if rec else "", found.entries, found.pending, found.signatures,
                           found.problems() + rebuilt.problems, rebuilt.missing_payloads, rebuilt.waiting_for,
                           [_aside(r) for r in found.aside])
        report.databases.append(d)
        out[db_id] = _Found(found, rebuilt, d)
        files = snapshots.by_db.get(db_id)
        if files and rebuilt.db is not None and not d.damaged:
            d.views, view_problems = check_views(home, rebuilt.db, files, repair=repair)
            d.problems += view_problems
    if repair:
        # Only once every database was read: a read that fails sends the repair to a salvage
        # of the file first (_Unreadable), which must find nothing moved yet.
        for db_id, f in out.items():
            f.report.repair = DatabaseRepair()
            moves = f.found.moves()
            storage.move_aside(db_id, moves, moved_ms=now_ms())
            f.report.repair.moved_aside = [m.entry_id for m in moves if not m.stores]
            f.report.repair.payloads_cleared = [[m.entry_id, s] for m in moves for s in m.stores]
    totals = storage.pending_totals_problems()
    report.storage.problems += [Problem("pending.totals", t) for t in totals]
    if repair and totals:
        storage.fix_pending_totals()

    def holds(db_id: str, key: str) -> bool | None:
        f = out.get(db_id)
        if (f is None or f.rebuilt.db is None or f.found.hidden or len(f.rebuilt.db) == 0
                or any(store == "_settings" for _e, store in f.rebuilt.missing_payloads)):
            return None  # without what was taken out (its root, a settings payload) its settings may lack the grant
        return f.rebuilt.db.permission(key) is not None

    keys.check_named(named, holds)
    report.keys, report.keys_checked = keys.problems, keys.checked
    for f in out.values():
        f.rebuilt.db = None  # its memory is not needed any more
    return out


def _stray_views(found: SnapshotFiles, known: set[str], repair: bool) -> list[dict[str, Any]]:
    """Snapshot files no database of this home reads: unreadable headers, other databases."""
    stray = [(p, why) for p, why in found.unreadable]
    stray += [(p, "of a database this node does not hold") for db, files in found.by_db.items() if db not in known
              for p, _meta in files]
    out = []
    for path, why in stray:
        if repair:
            path.unlink(missing_ok=True)
        out.append({"file": path.name, "store": None, "dim": None, "docs": None,
                    "verdict": f"not used: {why}" + ("; removed" if repair else "; the next opening ignores it")})
    return out


def _display_name(rebuilt: Rebuilt) -> str | None:
    if rebuilt.db is None:
        return None
    try:
        name = rebuilt.db.meta().get("display_name")
    except MemmeshError:
        return None
    return name if isinstance(name, str) and name else None


def _aside(record: Any) -> dict[str, Any]:
    return {"entry": record.id, "origin": record.origin, "reason": record.reason, "detail": record.detail,
            "moved_ms": record.moved_ms, "stores": list(record.stores)}


# ----------------------------------------------------------------------------- healing


def _needs_peers(f: _Found) -> bool:
    v = f.found
    return bool(v.damaged or v.orphans or v.payloads or v.absent or f.rebuilt.missing_payloads
                or f.rebuilt.waiting_for)


def _heal(home: Path, storage: SqliteStorage, keys: KeyCheck, lock_fd: int | None, found: dict[str, _Found],
          report: Report, events: EventSink | None) -> CoreNode:
    """Rebuild each database for real, fetch what is missing from its peers, apply orphans
    again, and say what was recovered and what was lost. Returns the node (the caller closes
    it), which owns ``storage`` and ``lock_fd`` from here on."""
    from memmesh.auth.keys import SigningKey
    from memmesh.node.core_node import CoreNode
    from memmesh.node.sync.oneshot import sync_now

    peer_key = keys.peer_key
    node = CoreNode(home, storage, peer_key if peer_key is not None else SigningKey.generate(), lock_fd)
    dbs = {}
    for db_id, f in found.items():
        try:
            dbs[db_id] = node.database(db_id)  # the derived state, rebuilt from the log as repaired
        except MemmeshError as exc:
            f.repair.error = str(exc)
            continue
        f.repair.erased = sum(p.code == "erase.not_applied" for p in f.report.problems)
    wanted = [d for d in dbs if _needs_peers(found[d])]
    peers_of = {d: node.sync.peers.peers(d) for d in wanted} if wanted else {}
    fetch = [d for d in wanted if peers_of[d]]
    why_not: dict[str, str] = {d: "no peer shares this database" for d in wanted if not peers_of[d]}
    if fetch and peer_key is None:
        for d in fetch:
            why_not[d] = "the peer key is missing, so no peer could be asked"
        fetch = []
    if fetch:
        if events is not None:
            events({"event": "progress", "bank": "fetch from peers", "done": 0, "total": len(fetch), "unit": "database"})
        try:
            exchanges = node.network.run(lambda run: sync_now(node, fetch, None, run, repairing=True))
        except (MemmeshError, OSError) as exc:
            exchanges = [{"db": d, "peer": "?", "address": "-", "ok": False, "error": str(exc), "pulled": 0,
                          "pushed": 0} for d in fetch]
        if events is not None:
            events({"event": "progress", "bank": "fetch from peers", "done": len(fetch), "total": len(fetch),
                    "unit": "database"})
        for x in exchanges:
            if x["db"] in found:
                found[x["db"]].repair.exchanges.append(x)
        for d in fetch:
            tried = found[d].repair.exchanges
            if tried and not any(x["ok"] for x in tried):
                why_not[d] = "its peers could not be reached (" + "; ".join(x["error"] for x in tried) + ")"
            else:
                why_not[d] = "no peer gave it back"
    for db_id, db in dbs.items():
        _reapply_orphans(storage, db, found[db_id].repair)
        _account(db, found[db_id], why_not.get(db_id, "no peer gave it back"))
        found[db_id].report.aside = [_aside(r) for r in storage.damaged(db_id)]
    _fence_lost(node, dbs, found, keys)
    return node


def _fence_lost(node: SyncHost, dbs: dict[str, Any], found: dict[str, _Found], keys: KeyCheck) -> None:
    """A write fence (node/fence.py) on each database that lost whole entries signed by a key of
    this home (or whose author could not be read), if another node may hold them: the next
    write would reuse their feed positions. A lost payload leaves its entry, and the feed, in place."""
    from memmesh.node import fence

    own = {str(k.public) for k in keys.loaded.values()}
    new = []
    for db_id, f in found.items():
        repair = f.repair
        lost: dict[str, int] = {}
        unknown = False
        for x in repair.lost:
            if x.store is not None:
                continue
            if x.author is None or x.seq is None:
                unknown = True
            elif x.author in own:
                lost[x.author] = max(x.seq, lost.get(x.author, -1))
        if (lost or unknown) and fence.held_elsewhere(node.sync, db_id, dbs.get(db_id), own):
            new.append(fence.Fence(db_id, fence.REPAIR, now_ms(), sorted(own), catch_up=unknown, lost=lost))
            repair.fenced = True
    fence.set_many(node.storage, new)


def _parents(stored_header: bytes) -> tuple[str, ...]:
    entry = decode_entry(stored_header, None, verify_signature=False)
    return (*entry.parents, *([entry.prev] if entry.prev else []))


def _reapply_orphans(storage: Storage, db: Any, repair: DatabaseRepair) -> None:
    """Orphans whose past is stored again (fetched from a peer) go back into the log through
    the normal pipeline; those a peer sent back themselves leave the damaged area."""
    orphans = [r.id for r in storage.damaged(db.id) if r.reason == "entry.orphaned"]
    if not orphans:
        return
    def present(entry_id: str) -> bool:
        return db.entry(entry_id) is not None

    back = [i for i in orphans if present(i)]
    rest = [i for i in orphans if not present(i)]
    # An orphan's own payload may be damaged too: it goes back as not received (sync fills it).
    copies = {i: _intact_damaged(storage, db.id, i) for i in rest}
    ready = sound_order(rest, lambda i: _parents(copies[i].header), present)
    for start in range(0, len(ready), REAPPLY_BATCH):  # in causal order: a batch's parents are stored
        db.ingest([(copies[i].header, dict(copies[i].payloads)) for i in ready[start:start + REAPPLY_BATCH]],
                  source=SOURCE)
    repair.reapplied = [i for i in ready if present(i)]
    storage.drop_damaged(db.id, back + repair.reapplied)


def _intact_damaged(storage: Storage, db_id: str, entry_id: str) -> StoredEntry:
    stored = storage.get_damaged(db_id, entry_id)
    assert stored is not None  # storage.damaged listed it a moment ago, on this thread
    return intact_copy(stored)


def _account(db: Any, f: _Found, why_not: str) -> None:
    """What came back and what is lost, per entry and payload the repair took out."""
    repair = f.repair
    v = f.found
    def present(entry_id: str) -> bool:
        return db.entry(entry_id) is not None

    for found, why in ((v.damaged, lambda p: f"damaged ({p.code}); {why_not}"),
                       (v.absent, lambda p: f"not stored although stored entries name it; {why_not}"),
                       (v.orphans, lambda p: f"{p.detail}: kept aside, it cannot be applied without it")):
        for entry_id, p in found.items():
            if present(entry_id):
                repair.recovered.append(entry_id)
            else:
                repair.lost.append(Lost(entry_id, why(p), author=p.author, seq=p.seq))
    for entry_id, (stores, p) in v.payloads.items():
        if entry_id in v.orphans:
            continue  # accounted for as a whole entry above
        for store in stores:
            if db.payload_state(entry_id, store) in ("present", "erased"):
                repair.payloads_recovered.append([entry_id, store])
            else:
                repair.lost.append(Lost(entry_id, f"its {store} payload was damaged; {why_not}", store=store,
                                        author=p.author, seq=p.seq))
