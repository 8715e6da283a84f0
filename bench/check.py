"""How fast `memmesh check` verifies a home.

    python bench/check.py [--quick] [--entries N] [--json PATH]

Builds a real home (``Node.init``, an agent, a bank granted to it) whose bank holds N signed
entries (default 100,000; ``--quick``: 10,000), one memory row each as `remember` writes it,
signed by the agent's key in one feed (each entry's parent is the previous one). The entries
are signed with ``sign_entry`` and stored with one ``append`` per 5,000, which is how a node
stores what it received, minus the validation pipeline (the bench is about checking, not
ingesting; `check` itself proves the home valid).

Then `memmesh check` (verify only, the CLI's path without serve: ``check_home``) runs on the
home, timed whole, and its steps timed apart on the same file:

* ``integrity_s``: SQLite's ``PRAGMA integrity_check`` and ``foreign_key_check``;
* ``verify_s``: every entry read, its id hashed, its header decoded, its payload digests and
  its signature checked (``decode_many``: signatures on every core);
* ``rebuild_s``: the derived state rebuilt from the log (``Database.open`` on a read-only view)
  and compared with storage.

``entries_per_s`` = entries / the whole check's time, signatures included;
``verify_entries_per_s`` = entries / ``verify_s``; ``ed25519_verify_per_s`` is one core's raw
Ed25519 rate, for scale. Prints a table; writes JSON (default ``bench/results/check.json``).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core import TEXT, bench_verify, machine  # noqa: E402

from memmesh.crdt.entry import client_id_for, sign_entry  # noqa: E402
from memmesh.crdt.storage import StoredEntry  # noqa: E402
from memmesh.crdt.yjs import encode_rows  # noqa: E402
from memmesh.node import Node  # noqa: E402
from memmesh.node.integrity import check_home  # noqa: E402
from memmesh.node.integrity.entries import rebuild, verify  # noqa: E402
from memmesh.node.storage import SqliteStorage  # noqa: E402

BANK = "bench"
BATCH = 5000


def build(home: Path, n: int) -> tuple[str, float]:
    """The home and its bank of ``n`` signed entries; returns (bank id, seconds to build)."""
    t = time.perf_counter()
    node, _ = Node.init(home)
    with node:
        node.run("embedder.set", {"provider": "none"})
        node.run("agent.new", {"name": "alpha"})
        node.run("memory.new", {"name": BANK})
        node.run("memory.grant", {"bank": BANK, "agent": "alpha", "perm": "write"})
        db = node.agents.resolve(BANK).db
        key = node.agents.agent("alpha").key
        client = client_id_for(key.public.raw)
        prev, parents = None, list(db.heads)
        batch: list[StoredEntry] = []
        for i in range(n):
            value = {"key": f"note.{i}", "value": f"{TEXT} ({i})", "tags": ["bench"]}
            update = encode_rows(client, i, "memory", [(f"{client}/{i}", value)])
            entry = sign_entry(key, db=db.id, seq=i, prev=prev, parents=parents, ts=1_767_225_600_000 + i,
                               payloads={"memory": (update, i, 1)})
            batch.append(StoredEntry(entry.id, entry.header, dict(entry.payloads)))
            prev, parents = entry.id, [entry.id]
            if len(batch) >= BATCH:
                node.storage.append(db.id, batch)
                batch = []
        if batch:
            node.storage.append(db.id, batch)
        bank_id = db.id
    return bank_id, time.perf_counter() - t


def steps(home: Path, bank_id: str) -> dict[str, float]:
    snapshot = SqliteStorage.open_snapshot(home / "node.sqlite")
    try:
        t = time.perf_counter()
        problems = snapshot.integrity_problems()
        integrity = time.perf_counter() - t
        t = time.perf_counter()
        found = verify(snapshot, bank_id)
        verified = time.perf_counter() - t
        t = time.perf_counter()
        rebuilt = rebuild(snapshot, found)
        rebuilt_s = time.perf_counter() - t
    finally:
        snapshot.close()
    if problems or found.problems() or rebuilt.problems or rebuilt.db is None:
        raise SystemExit(f"bench: the built home is not healthy: {problems[:2]} {found.problems()[:2]} {rebuilt.problems[:2]}")
    return {"integrity_s": integrity, "verify_s": verified, "rebuild_s": rebuilt_s, "signatures": found.signatures}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10,000 entries (a smoke run)")
    ap.add_argument("--entries", type=int, help="entries in the bank (default 100,000; --quick 10,000)")
    ap.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "check.json",
                    help="write the results here")
    args = ap.parse_args()
    n = args.entries or (10_000 if args.quick else 100_000)
    with tempfile.TemporaryDirectory(prefix="memmesh-bench-check-") as tmp:
        home = Path(tmp) / "home"
        bank_id, build_s = build(home, n)
        size = (home / "node.sqlite").stat().st_size
        t = time.perf_counter()
        report = check_home(home)
        total_s = time.perf_counter() - t
        if not report.healthy:
            raise SystemExit(f"bench: check found damage in the built home: {report.verdict()}")
        entries = report.as_dict()["entries"]
        parts = steps(home, bank_id)
    raw = bench_verify(5000)
    results = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": machine(),
        "entries": entries,
        "bank_entries": n,
        "file_mb": round(size / 2**20, 1),
        "build_s": round(build_s, 2),
        "check_s": round(total_s, 2),
        "entries_per_s": round(entries / total_s),
        "signatures": report.as_dict()["signatures"],
        "integrity_s": round(parts["integrity_s"], 2),
        "verify_s": round(parts["verify_s"], 2),
        "verify_entries_per_s": round(n / parts["verify_s"]),
        "rebuild_s": round(parts["rebuild_s"], 2),
        "ed25519_verify_per_s": round(raw),
    }
    print(f"memmesh check benchmark  {results['date']}  {results['machine']['cpu']} x{results['machine']['cores']}")
    print(f"{'metric':<36}{'value':>14}")
    for name in ("entries", "file_mb", "build_s", "check_s", "entries_per_s", "signatures", "integrity_s",
                 "verify_s", "verify_entries_per_s", "rebuild_s", "ed25519_verify_per_s"):
        value = results[name]
        print(f"{name:<36}{value:>14,}" if isinstance(value, int) else f"{name:<36}{value:>14}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
