"""How long ``Database.open`` takes on a memory bank of N memories (issue 23, "open in constant time").

Usage::

    python bench/open_db.py [--sizes 100000,1000000] [--dir DIR] [--repeats 3] [--json PATH]

The bank is built as bench/recall.py builds it: Chit-Chat messages after a seeded shuffle
(seed 20240601) as memory values, ``ROWS_PER_ENTRY`` (200) memories and their hashed-embedder
vectors (384 dims) per signed entry, written through ``Database.transaction`` into an SQLite
file. Past the ~139k messages of the dataset the messages repeat, under unique keys. No memory
view is attached while building: open reads the log, not the view. A bank is built once and
kept in ``--dir`` (default: a directory in the system's temporary directory), next to a small
JSON file naming its database; later runs reuse it.

``db_open_s``: the median of ``--repeats`` runs of ``Database.open`` on a new ``SqliteStorage``
of the file, each in a fresh Python process (nothing cached in the interpreter; the file is in
the operating system's page cache after the first run). ``open_samples_s`` has every run,
``db_open_cpu_s`` the median CPU time of the process (both threads of the open: on a busy
machine it says more than the wall time), ``loadavg`` the machine's load when measured.

A ``PYTHONPATH`` given to this script comes first in the child's path: that times another
checkout's ``Database.open`` on the same bank (how the figures before a change were taken).

``measure(n_memories)`` is what other benches import.
"""
from __future__ import annotations

import os

os.environ["OPENBLAS_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

SEED = 20240601
ROWS_PER_ENTRY = 200
KEY_WORDS = 3
TAGS = ("chat", "personal", "work", "ideas", "todo", "family")
DEFAULT_DIR = Path(tempfile.gettempdir()) / "memmesh-bench-open"

# Run in a fresh interpreter: imports first, then one timed open.
_CHILD = """
import gc, json, sys, time
from memmesh.crdt.database import Database
from memmesh.node.storage import SqliteStorage
path, db_id = sys.argv[1], sys.argv[2]
gc.collect()
storage = SqliteStorage(path)
t, cpu = time.perf_counter(), time.process_time()
db = Database.open(storage, db_id)
elapsed, cpu = time.perf_counter() - t, time.process_time() - cpu
print(json.dumps({"open_s": elapsed, "cpu_s": cpu, "entries": len(db)}))
storage.close()
"""


def log(msg: str) -> None:
    print(f"[open_db] {msg}", file=sys.stderr, flush=True)


def _memories(n: int) -> list[tuple[str, str, list[str]]]:
    import random

    from _common import load_messages

    from memmesh.node.memory.rows import MAX_VALUE_CHARS
    from memmesh.node.memory.tokens import tokenize

    # A few messages are longer than a memory may be; the first 100k (recall.py's) are not.
    msgs = [m for m in load_messages(SEED) if len(m) <= MAX_VALUE_CHARS]
    rnd = random.Random(SEED + 7)
    out = []
    for i in range(n):
        msg = msgs[i % len(msgs)]
        words = [w[:24] for w in tokenize(msg)[:KEY_WORDS]] or ["note"]
        out.append(("-".join(words) + f"-n{i:07d}", msg, rnd.sample(TAGS, rnd.randint(1, 2))))
    return out


def build(path: Path, n: int) -> dict[str, Any]:
    """Write a bank of ``n`` memories to ``path``; returns what ``bank`` records of it."""
    from _bank import write_bank

    storage, _key, db, build_s = write_bank(
        path, _memories(n), f"open-{n}", rows_per_entry=ROWS_PER_ENTRY,
        progress=lambda done, secs: log(f"built {done} of {n} memories ({secs:.0f} s)"))
    info = {"db_id": db.id, "memories": n, "entries": len(db), "build_s": build_s,
            "file_mb": path.stat().st_size / 2**20, "seed": SEED, "rows_per_entry": ROWS_PER_ENTRY}
    storage.close()
    return info


def bank(n: int, workdir: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """The bank of ``n`` memories in ``workdir``, built unless a complete one is there."""
    workdir = Path(workdir or DEFAULT_DIR)
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"open-{n}.sqlite"
    meta = workdir / f"open-{n}.json"
    if path.exists() and meta.exists():
        return path, json.loads(meta.read_text())
    log(f"building a bank of {n} memories in {path} (once)")
    info = build(path, n)
    meta.write_text(json.dumps(info))  # written last: its presence marks a complete bank
    return path, info


def time_open(path: Path, db_id: str) -> dict[str, Any]:
    """One ``Database.open`` in a fresh interpreter."""
    # The tree this script belongs to, after any PYTHONPATH given (to time another tree's code).
    paths = [p for p in (os.environ.get("PYTHONPATH", ""), str(HERE.parent)) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    # -P: no current directory ahead of PYTHONPATH (a checkout's memmesh/ would shadow it).
    done = subprocess.run([sys.executable, "-P", "-c", _CHILD, str(path), db_id], capture_output=True, text=True,
                          env=env, check=False, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise RuntimeError(f"open_db: opening {path} failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure(n_memories: int, *, workdir: Path | None = None, repeats: int = 3) -> dict[str, Any]:
    """``db_open_s`` (median of ``repeats`` fresh-process opens) of a bank of ``n_memories``."""
    path, info = bank(n_memories, workdir)
    gc.collect()
    runs = [time_open(path, info["db_id"]) for _ in range(repeats)]
    samples = [r["open_s"] for r in runs]
    if any(r["entries"] != info["entries"] for r in runs):
        raise RuntimeError(f"open_db: the reopened database of {path} does not hold {info['entries']} entries")
    return {"memories": n_memories, "entries": info["entries"], "file_mb": info["file_mb"],
            "db_open_s": statistics.median(samples), "open_samples_s": samples,
            "db_open_cpu_s": statistics.median(r["cpu_s"] for r in runs),
            "loadavg": Path("/proc/loadavg").read_text().split()[:3]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100000", help="comma-separated bank sizes (memories)")
    ap.add_argument("--dir", type=Path, default=None, help="where banks are built and kept")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="write every figure to this file")
    args = ap.parse_args(argv)
    results = {}
    for n in (int(s) for s in args.sizes.split(",") if s.strip()):
        r = measure(n, workdir=args.dir, repeats=args.repeats)
        results[str(n)] = r
        print(f"{n:>9} memories  {r['entries']:>6} entries  {r['file_mb']:8.1f} MB  "
              f"db_open_s {r['db_open_s']:.3f}  (runs: {', '.join(f'{s:.3f}' for s in r['open_samples_s'])})  "
              f"cpu {r['db_open_cpu_s']:.3f} s  load {' '.join(r['loadavg'])}")
    if args.json:
        args.json.write_text(json.dumps({"open_db": results, "loadavg": Path("/proc/loadavg").read_text().split()[:3]},
                                        indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
