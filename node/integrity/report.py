"""What `memmesh check` found and did: records, their JSON form, and the text for people.

Every problem has a stable ``code`` (the entry checks reuse the reason codes of the receive
pipeline, docs/protocol.md section 3.7: ``entry.id``, ``entry.payload``, ``entry.signature``,
``entry.format``, ...; the others are listed in ``CODES``) and says whether it is *damage*
(the home is not what was written: exit 1) or a *notice* (worth knowing, healthy: exit 0).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Codes of problems that are not an entry's own reason code (those come from crdt.entry).
CODES = {
    "entry.orphaned": "an intact entry that descends from a damaged or missing one: it cannot be applied without it",
    "entry.parent_missing": "an entry named as a parent (or feed predecessor) by stored entries is not stored",
    "erase.not_applied": "a payload that an accepted erase covers is still stored",
    "pending.damaged": "an entry of the pending area fails its checks",
    "sqlite.integrity": "SQLite's own integrity check of the storage file fails",
    "sqlite.unreadable": "the storage file, or part of it, cannot be read",
    "sqlite.schema": "a table of the storage file is not defined as memmesh defines it",
    "pending.totals": "the running totals of the pending area's bound differ from its rows",
    "derived.unbuildable": "the database's derived state cannot be rebuilt from its log",
    "key.missing": "a key file the node needs is not there",
    "key.mode": "a key file is readable by other users",
    "key.damaged": "a key file cannot be read as a key",
    "key.mismatch": "a key file holds a key its database does not know",
    "local.damaged": "a peer-local record (the agent and bank registry) cannot be read",
    "local.unknown_db": "a peer-local record names a database this node does not hold",
    "local.stale": "a peer-local side record (access counts) that is ignored",
    "view.snapshot": "a view snapshot that passes its own checks differs from a view rebuilt from the log",
}


@dataclass
class Problem:
    code: str
    detail: str
    entry: str | None = None  # the entry id it concerns
    store: str | None = None  # the payload it concerns
    author: str | None = None  # the entry's author, when its header could be read
    seq: int | None = None
    damage: bool = True  # False: a notice, the home is healthy
    repairable: bool = True  # False: check --repair cannot rebuild it; only a backup can

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        who = ""
        if self.author is not None or self.seq is not None:
            parts = [p for p in (self.author and f"author {short(self.author)}",
                                 self.seq is not None and f"seq {self.seq}") if p]
            who = f" ({', '.join(parts)})"
        what = f"{self.entry}{who}: " if self.entry else ""
        return f"{self.code}: {what}{self.detail}"


@dataclass
class Lost:
    """What a repair could not get back: an entry (or one payload of it)."""

    entry: str
    why: str
    store: str | None = None
    author: str | None = None
    seq: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DatabaseRepair:
    moved_aside: list[str] = field(default_factory=list)  # whole entries, out of the log or pending
    payloads_cleared: list[list[str]] = field(default_factory=list)  # [entry, store]: now "not received"
    erased: int = 0  # payloads an accepted erase covers, erased now
    exchanges: list[dict[str, Any]] = field(default_factory=list)  # what the fetch from peers did
    reapplied: list[str] = field(default_factory=list)  # orphans put back into the log once their past came
    recovered: list[str] = field(default_factory=list)  # entries back in the log
    payloads_recovered: list[list[str]] = field(default_factory=list)
    lost: list[Lost] = field(default_factory=list)
    error: str | None = None  # the database could not be opened after the repair
    fenced: bool = False  # it lost entries of this node's keys: local writes wait (node/fence.py)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["lost"] = [x.as_dict() for x in self.lost]
        return d


@dataclass
class DatabaseReport:
    db: str
    name: str  # the registry's name, the display name, or the id
    kind: str  # "agent", "bank", "archived bank", or "" when the registry does not name it
    entries: int = 0  # entries of the log read
    pending: int = 0  # entries of the pending area read
    signatures: int = 0  # signatures verified
    problems: list[Problem] = field(default_factory=list)
    missing_payloads: list[list[str]] = field(default_factory=list)  # [entry, store] not received, no erase
    waiting_for: list[str] = field(default_factory=list)  # parents the pending area waits for
    aside: list[dict[str, Any]] = field(default_factory=list)  # what the damaged area holds
    repair: DatabaseRepair | None = None
    views: list[dict[str, Any]] = field(default_factory=list)  # its view snapshots against a rebuild

    @property
    def damaged(self) -> bool:
        return any(p.damage for p in self.problems)

    def as_dict(self) -> dict[str, Any]:
        return {"db": self.db, "name": self.name, "kind": self.kind, "entries": self.entries, "pending": self.pending,
                "signatures": self.signatures, "healthy": not self.damaged,
                "problems": [p.as_dict() for p in self.problems], "missing_payloads": self.missing_payloads,
                "waiting_for": self.waiting_for, "aside": self.aside,
                "repair": None if self.repair is None else self.repair.as_dict(), "views": self.views}


@dataclass
class StorageReport:
    file: str
    schema_version: int | None = None
    problems: list[Problem] = field(default_factory=list)
    salvaged: dict[str, Any] | None = None  # what rebuilding the file copied and lost

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "schema_version": self.schema_version,
                "healthy": not any(p.damage for p in self.problems),
                "problems": [p.as_dict() for p in self.problems], "salvaged": self.salvaged}


@dataclass
class Report:
    home: str
    repair: bool  # was --repair asked for
    storage: StorageReport
    keys_checked: int = 0
    keys: list[Problem] = field(default_factory=list)
    local: list[Problem] = field(default_factory=list)
    databases: list[DatabaseReport] = field(default_factory=list)
    stray_views: list[dict[str, Any]] = field(default_factory=list)  # snapshot files of no database here
    seconds: float = 0.0

    # ------------------------------------------------------------------ the verdict
    def problems(self) -> list[Problem]:
        out = [*self.storage.problems, *self.keys, *self.local]
        for d in self.databases:
            out += d.problems
        return out

    def found_damage(self) -> bool:
        return any(p.damage for p in self.problems())

    def lost(self) -> list[tuple[DatabaseReport, Lost]]:
        return [(d, x) for d in self.databases if d.repair for x in d.repair.lost]

    def remaining(self) -> list[str]:
        """After a repair: what is still wrong (lost data, what no repair can fix)."""
        out = [f"{len(self.lost())} entr{'y' if len(self.lost()) == 1 else 'ies'} or payloads could not be recovered"
               ] if self.lost() else []
        out += [f"{d.name}: {d.repair.error}" for d in self.databases if d.repair and d.repair.error]
        # What a repair does not touch: keys and peer-local records are never synced.
        out += [p.line() for p in [*self.keys, *self.local] if p.damage]
        # A repair recounts the pending totals, and a salvage replaces a file SQLite finds damaged.
        fixed = {"pending.totals"} | ({"sqlite.integrity", "sqlite.schema", "sqlite.unreadable"}
                                      if self.storage.salvaged else set())
        out += [p.line() for p in self.storage.problems if p.damage and p.code not in fixed]
        return out

    @property
    def healthy(self) -> bool:
        """Check: nothing damaged. Repair: everything found was repaired and recovered."""
        return not self.remaining() if self.repair else not self.found_damage()

    @property
    def exit_code(self) -> int:
        return 0 if self.healthy else 1

    def as_dict(self) -> dict[str, Any]:
        return {"home": self.home, "repair": self.repair, "healthy": self.healthy,
                "found_damage": self.found_damage(), "remaining": self.remaining() if self.repair else None,
                "storage": self.storage.as_dict(), "keys": {"checked": self.keys_checked,
                                                            "problems": [p.as_dict() for p in self.keys]},
                "local": [p.as_dict() for p in self.local],
                "databases": [d.as_dict() for d in self.databases], "stray_views": self.stray_views,
                "seconds": round(self.seconds, 3),
                "entries": sum(d.entries + d.pending for d in self.databases),
                "signatures": sum(d.signatures for d in self.databases)}

    # ------------------------------------------------------------------ text
    def text(self) -> str:
        lines = [f"storage {self.storage.file}: " + (
            "SQLite integrity check ok" if not self.storage.problems else
            f"{len(self.storage.problems)} problem{'s' if len(self.storage.problems) != 1 else ''}")]
        lines += [f"  {p.line()}" for p in self.storage.problems[:10]]
        if len(self.storage.problems) > 10:
            lines.append(f"  ... and {len(self.storage.problems) - 10} more (--json lists them all)")
        if self.storage.salvaged is not None:
            s = self.storage.salvaged
            lines.append(f"  rebuilt from every row that could be read ({s['rows']} rows; unreadable: "
                         f"{s['unreadable'] or 'none'}); the old file is kept as {s['kept']}")
        lines.append(f"keys: {self.keys_checked} key file{'s' if self.keys_checked != 1 else ''} checked" +
                     ("" if self.keys else ", all 0600, loading, and held by their databases"))
        lines += [f"  {p.line()}" for p in self.keys]
        lines += [f"peer-local records: {p.line()}" for p in self.local]
        for d in self.databases:
            lines += _database_lines(d)
        lines += [f"view snapshot {v['file']}: {v['verdict']}" for v in self.stray_views]
        total = sum(d.entries + d.pending for d in self.databases)
        rate = f", {total / self.seconds:,.0f} entries/s" if self.seconds > 0 and total else ""
        lines.append(f"checked {total:,} entries ({sum(d.signatures for d in self.databases):,} signatures) "
                     f"in {self.seconds:.2f} s{rate}")
        lines.append("verdict: " + self.verdict())
        return "\n".join(lines)

    def verdict(self) -> str:
        if not self.repair:
            if not self.found_damage():
                return "healthy"
            where = [d.name for d in self.databases if d.damaged]
            parts = ([f"{len(where)} database{'s' if len(where) != 1 else ''} ({', '.join(where)})"] if where else [])
            parts += ["the storage file"] if any(p.damage for p in self.storage.problems) else []
            parts += ["the keys"] if any(p.damage for p in self.keys) else []
            parts += ["the peer-local records"] if any(p.damage for p in self.local) else []
            lost = [p for p in self.storage.problems if p.damage and not p.repairable]
            if lost:  # advising --repair would only lead to its own "restore a backup"
                return "DAMAGED: the storage file cannot be read, and check --repair cannot rebuild it: restore a " \
                       "backup (memmesh restore)"
            return f"DAMAGED: {', '.join(parts)}; run memmesh check --repair (with serve stopped)"
        remaining = self.remaining()
        if not self.found_damage():
            return "healthy; nothing to repair"
        if not remaining:
            return "repaired; everything damaged was recovered"
        return "repaired what could be; NOT recovered: " + "; ".join(remaining)


def short(key: str) -> str:
    return key if len(key) <= 24 else key[:20] + "..."


def _database_lines(d: DatabaseReport) -> list[str]:
    kind = f"{d.kind} " if d.kind else "database "
    named = f"{kind}{d.name}" + ("" if d.name == d.db else f" ({d.db})")
    status = "DAMAGED" if d.damaged else "ok"
    pending = f", {d.pending:,} pending" if d.pending else ""
    lines = [f"{named}: {d.entries:,} entries{pending}: {status}"]
    shown = [p for p in d.problems if p.code != "entry.orphaned"]
    lines.extend(f"  {p.line()}" for p in shown[:20])
    if len(shown) > 20:
        lines.append(f"  ... and {len(shown) - 20} more (--json lists them all)")
    orphans = [p for p in d.problems if p.code == "entry.orphaned"]
    if orphans:
        lines.append(f"  entry.orphaned: {len(orphans)} intact entr{'y descends' if len(orphans) == 1 else 'ies descend'} "
                     "from damaged or missing ones and cannot be applied without them")
    if d.missing_payloads:
        n = len(d.missing_payloads)
        lines.append(f"  {n} payload{'s' if n != 1 else ''} not received (no erase covers "
                     f"{'them' if n != 1 else 'it'}): sync fetches {'them' if n != 1 else 'it'} from peers")
    if d.waiting_for:
        lines.append(f"  the pending area waits for {len(d.waiting_for)} parent{'s' if len(d.waiting_for) != 1 else ''}: "
                     "sync fetches them from peers")
    lines.extend(f"  view snapshot ({v['store'] or 'no embeddings'}, {v['docs']:,} docs): {v['verdict']}"
                 for v in d.views)
    if d.aside:
        lines.append(f"  the damaged area keeps {len(d.aside)} entr{'y' if len(d.aside) == 1 else 'ies'} moved aside "
                     "by a repair (never applied or served)")
    r = d.repair
    if r is not None:
        did = [f"moved {len(r.moved_aside)} aside"] if r.moved_aside else []
        did += [f"cleared {len(r.payloads_cleared)} damaged payload{'s' if len(r.payloads_cleared) != 1 else ''}"
                ] if r.payloads_cleared else []
        did += [f"erased {r.erased} payload{'s' if r.erased != 1 else ''} that accepted erases cover"] if r.erased else []
        for x in r.exchanges:
            did.append(f"fetched from {short(x['peer'])} at {x['address']}: pulled {x['pulled']}" if x["ok"]
                       else f"could not fetch from {short(x['peer'])} at {x['address']}: {x['error']}")
        did += [f"re-applied {len(r.reapplied)} orphaned entr{'y' if len(r.reapplied) == 1 else 'ies'}"] if r.reapplied else []
        got = len(r.recovered) + len(r.payloads_recovered)
        did += [f"recovered {got}"] if got else []
        if did:
            lines.append("  repair: " + "; ".join(did))
        if r.error:
            lines.append(f"  repair: the database does not open: {r.error}")
        if r.lost:
            lines.append(f"  LOST ({len(r.lost)}): no peer gave them back")
            for lost in r.lost[:20]:
                who = ", ".join(p for p in (lost.author and f"author {lost.author}",
                                            lost.seq is not None and f"seq {lost.seq}",
                                            lost.store and f"payload {lost.store}") if p)
                lines.append(f"    {lost.entry}" + (f" ({who})" if who else "") + f": {lost.why}")
            if len(r.lost) > 20:
                lines.append(f"    ... and {len(r.lost) - 20} more (--json lists them all)")
        if r.fenced:
            lines.append("  FENCED: it lost entries this node's keys signed, which a peer may still hold: local "
                         "writes are refused until a sync brings them back (memmesh unfence "
                         f"{d.name if d.kind else d.db} lifts it by hand)")
    return lines
