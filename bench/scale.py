"""Scale benchmark: big banks opened at once, a million memories per bank, a thousand banks per
node, entries accepted at the speed of signature checks (docs/benchmarks.md, "Scale").

One run writes every figure of the issue, with the machine, the date and the load average:

* ``open_first_recall_s`` at 100k and 1M: in a fresh process, ``Database.open`` of the bank's
  SQLite file, its memory view (from its snapshot: node/memory/snapshot.py), and the first
  hybrid recall (median of 3 fresh processes); ``db_open_s`` and ``view_open_s`` apart.
* ``recall_hybrid_ms_p50/p99`` at 100k and 1M: hybrid recall (hashed embedder: embed the
  query, then rank) over the opened view, 500 queries from held-out messages.
* ``view_rss_mib`` at 100k and 1M: VmRSS of that process after the view opened minus before
  (freed heap handed back first, both times).
* ``top10_agreement_vs_exact``: the quantised first pass against exact float32 hybrid ranking
  (bench/scale_vectors.py), at each size.
* ``top10_agreement_vs_exact_local_100k`` (fused), ``top10_cosine_agreement_local_100k``,
  ``vector_search_ms_p50/p99_local_100k`` and ``exact_vector_search_ms_p50/p99_local_100k``: the
  same check with the local model's dense vectors (``scale_vectors.measure_local``; cached in
  ``--work``, else in a temporary directory kept between runs; skipped, and said so, when the
  ``embed`` extra is not installed; ``--quick``: 2k memories, cut not deepened).
* ``serve_first_command_s_1000_banks``: ``memmesh serve`` over 1,000 banks of 1k memories
  each, from its start to its first answered command (bench/scale_banks.py).
* ``remote_apply_per_verify``: received entries accepted per second over one core's raw
  Ed25519 verifications, both in one run of bench/core.py.

Memories are Chit-Chat messages (the ``chitchat-dataset`` package) as bench/recall.py makes
them, 200 per signed entry with their vectors; past the corpus's size the messages are used
again with a round number appended (keys stay unique). ``--quick`` (under two minutes) measures
20k and 100 banks of 100 and says so; the full run takes about an hour.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import HELD_OUT, load_messages, machine, make_queries, pct  # noqa: E402

SEED = 20240601
ROWS_PER_ENTRY = 200
OPEN_REPEATS = 3
QUERIES = 500
TARGETS = {  # the targets: key -> (bound, "<=" or ">=")
    "open_first_recall_s_100k": (1.0, "<="), "open_first_recall_s_1m": (5.0, "<="),
    "recall_hybrid_ms_p99_1m": (50.0, "<="), "view_rss_mib_1m": (2048.0, "<="),
    "top10_agreement_vs_exact": (0.99, ">="), "serve_first_command_s_1000_banks": (5.0, "<="),
    "remote_apply_per_verify": (1.0, ">="),
}


def label(n: int) -> str:
    return f"{n // 1_000_000}m" if n % 1_000_000 == 0 else f"{n // 1000}k"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def corpus(n: int) -> tuple[list[tuple[str, str, list[str]]], list[list[str]]]:
    """``n`` memories (key, value, tags) and the queries, as bench/recall.py makes them."""
    import random

    from recall import make_memories

    from memmesh.node.memory.tokens import tokenize

    msgs = load_messages(SEED)
    held = msgs[-HELD_OUT:]
    base = msgs[:-HELD_OUT]
    texts = [m if i < len(base) else f"{m} (round {i // len(base)})" for i, m in
             ((i, base[i % len(base)]) for i in range(n))]
    mems = make_memories(texts, SEED + 7)
    queries = make_queries([tokenize(m) for m in held], QUERIES, random.Random(SEED + 1))
    return mems, queries


# ------------------------------------------------------------------ phases (own processes)
def phase_build(path: Path, views: Path, n: int) -> dict:
    """The bank's file (no view while writing), then its view from the log and its snapshot."""
    from _bank import write_bank

    from memmesh.node.memory.embedders import HashedEmbedder
    from memmesh.node.memory.snapshot import Snapshots
    from memmesh.node.memory.view import MemoryView

    mems, _ = corpus(n)
    hashed = HashedEmbedder()
    storage, _key, db, write_s = write_bank(path, mems, f"scale-{label(n)}", rows_per_entry=ROWS_PER_ENTRY,
                                            progress=lambda done, _s: log(f"build {label(n)}: {done:,} memories"))
    t0 = time.perf_counter()
    view = MemoryView(db, embedding_store=hashed.store_name, dim=hashed.dim, snapshots=Snapshots(views))
    rebuild_s = time.perf_counter() - t0
    if len(view) != n:
        raise SystemExit(f"scale: the view holds {len(view)} memories, expected {n}")
    t0 = time.perf_counter()
    view.save_snapshot()
    save_s = time.perf_counter() - t0
    (snap,) = Snapshots(views).files()
    return {"write_s": write_s, "view_rebuild_s": rebuild_s, "snapshot_save_s": save_s,
            "db_file_mib": path.stat().st_size / 2**20, "snapshot_file_mib": snap.stat().st_size / 2**20}


def phase_open(path: Path, views: Path, n: int, queries: int) -> dict:
    """Open the bank as a node opens it, first recall, then the recall latencies and RSS."""
    import gc

    from recall import trimmed_rss_mib

    from memmesh.crdt.database import Database
    from memmesh.node.memory.embedders import HashedEmbedder
    from memmesh.node.memory.snapshot import Snapshots
    from memmesh.node.memory.view import MemoryView
    from memmesh.node.storage import SqliteStorage

    hashed = HashedEmbedder()
    _, qs = corpus(1) if queries else ([], [])
    texts = [" ".join(q) for q in qs] or ["how was your weekend"]
    rss0 = trimmed_rss_mib()
    t0 = time.perf_counter()
    storage = SqliteStorage(path)
    db = Database.open(storage, storage.databases()[0])
    t1 = time.perf_counter()
    rss_db = trimmed_rss_mib()
    t1b = time.perf_counter()
    view = MemoryView(db, embedding_store=hashed.store_name, dim=hashed.dim, snapshots=Snapshots(views))
    t2 = time.perf_counter()
    view.recall(texts[0], query_vector=hashed.embed([texts[0]])[0])
    t3 = time.perf_counter()
    out = {"db_open_s": t1 - t0, "view_open_s": t2 - t1b, "first_recall_s": t3 - t2,
           "open_first_recall_s": (t1 - t0) + (t3 - t1b), "opened_from": view.opened_from,
           "snapshot_note": view.snapshot_note, "memories": len(view)}
    out["view_rss_mib"] = trimmed_rss_mib() - rss_db
    out["db_rss_mib"] = rss_db - rss0
    if queries:
        samples = []
        for text in texts[:20]:
            view.recall(text, query_vector=hashed.embed([text])[0])
        gc.collect()
        gc.freeze()
        for text in texts:
            t = time.perf_counter_ns()
            view.recall(text, query_vector=hashed.embed([text])[0])
            samples.append(time.perf_counter_ns() - t)
        p = pct(samples)
        out["recall_hybrid_ms_p50"], out["recall_hybrid_ms_p99"] = p["p50_ms"], p["p99_ms"]
    return out


def run_phase(name: str, *args: str) -> dict:
    """A phase in a fresh process (what opening a node costs, with nothing warm)."""
    proc = subprocess.run([sys.executable, __file__, "--phase", name, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"scale: phase {name} failed:\n{proc.stderr[-3000:]}")
    sys.stderr.write(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bank_figures(tmp: Path, n: int) -> dict:
    path, views = tmp / f"bank-{label(n)}.sqlite", tmp / f"views-{label(n)}"
    built_json = tmp / f"bank-{label(n)}.built.json"
    if path.exists() and built_json.exists() and any(views.glob("*.view")):
        log(f"{label(n)}: using the bank built before in {tmp}")
        built = json.loads(built_json.read_text())
    else:
        for f in [*tmp.glob(f"bank-{label(n)}.sqlite*"), *views.glob("*")]:
            f.unlink()
        log(f"{label(n)}: building the bank")
        built = run_phase("build", str(path), str(views), str(n))
        built_json.write_text(json.dumps(built))
        log(f"{label(n)}: built in {built['write_s']:.0f} s, view from the log {built['view_rebuild_s']:.1f} s")
    opens = [run_phase("open", str(path), str(views), str(n), "0") for _ in range(OPEN_REPEATS)]
    timed = run_phase("open", str(path), str(views), str(n), str(QUERIES))
    med = sorted(opens, key=lambda o: o["open_first_recall_s"])[len(opens) // 2]
    return {**built, **{k: med[k] for k in ("db_open_s", "view_open_s", "first_recall_s", "open_first_recall_s",
                                           "opened_from", "snapshot_note")},
            "open_samples_s": [o["open_first_recall_s"] for o in opens], "view_rss_mib": timed["view_rss_mib"],
            "db_rss_mib": timed["db_rss_mib"], "recall_hybrid_ms_p50": timed["recall_hybrid_ms_p50"],
            "recall_hybrid_ms_p99": timed["recall_hybrid_ms_p99"]}


def core_ratio(quick: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "core.json"
        cmd = [sys.executable, str(Path(__file__).with_name("core.py")), "--json", str(out)]
        subprocess.run(cmd + (["--quick"] if quick else []), check=True, capture_output=True)
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="20k memories, 100 banks of 100 (under two minutes)")
    ap.add_argument("--json", type=Path, help="write every figure to this file")
    ap.add_argument("--sizes", help="bank sizes, comma-separated (default 100000,1000000; --quick 20000)")
    ap.add_argument("--parts", default="sizes,vectors,banks,core",
                    help="which parts to run (default: all of sizes,vectors,banks,core)")
    ap.add_argument("--work", type=Path, help="keep the banks built here and use them again when present "
                    "(default: a temporary directory, removed)")
    ap.add_argument("--phase", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args(argv)
    if args.phase:  # a phase in its own process: its result is the last line of stdout
        fn = {"build": phase_build, "open": phase_open}[args.phase]
        out = fn(Path(rest[0]), Path(rest[1]), int(rest[2]), *(int(x) for x in rest[3:]))
        print(json.dumps(out))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else ([20_000] if args.quick else [100_000, 1_000_000])
    banks, per_bank = (100, 100) if args.quick else (1000, 1000)
    report: dict = {"bench": "scale", "date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(),
                    "quick": args.quick, "loadavg_start": loadavg(), "rows_per_entry": ROWS_PER_ENTRY,
                    "embedder": "hashed (384 dimensions)", "sizes": {}}
    flat: dict = {}
    report["figures"], report["errors"] = flat, {}

    def section(name: str, fn) -> None:
        """One part of the run; a part that fails is reported and the others still run."""
        try:
            fn()
        except (Exception, SystemExit) as exc:
            log(f"{name} failed: {exc}")
            report["errors"][name] = str(exc)[-2000:]
        if args.json:  # what is measured so far, in case a later part takes the machine down
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2) + "\n")

    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory(prefix="memmesh-scale-") as tmp_name:
        tmp = args.work or Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        for n in sizes if "sizes" in parts else ():
            def bank(n: int = n) -> None:
                fig = bank_figures(tmp, n)
                report["sizes"][label(n)] = fig
                for k in ("open_first_recall_s", "recall_hybrid_ms_p50", "recall_hybrid_ms_p99", "view_rss_mib"):
                    flat[f"{k}_{label(n)}"] = fig[k]
                if args.work is None:
                    for f in tmp.glob(f"bank-{label(n)}.sqlite*"):
                        f.unlink()
            section(f"bank {label(n)}", bank)

    def vectors() -> None:
        import scale_vectors

        report["vectors"] = {}
        for n in sizes:
            log(f"{label(n)}: quantised first pass against exact float32")
            report["vectors"][label(n)] = scale_vectors.measure(n, 200 if args.quick else QUERIES, SEED)
        flat["top10_agreement_vs_exact"] = min(a["hybrid_top10_agreement"] for a in report["vectors"].values())

    def vectors_local() -> None:
        import scale_vectors

        n = 2_000 if args.quick else 100_000  # the local model embeds about 50-150 texts/s
        log(f"{label(n)}: the local model's (dense) vectors, quantised first pass against exact")
        out = scale_vectors.measure_local(n, 200 if args.quick else QUERIES, SEED, cache=args.work,
                                          sweep=not args.quick)
        report["vectors_local"] = out
        if "skipped" in out:
            log(f"local model check skipped: {out['skipped']}")
            return
        flat.update({f"{k}_local_{label(n)}": v for k, v in scale_vectors.local_headline(out).items()})
    if "vectors" in parts:
        section("vectors", vectors)
        section("vectors (local model)", vectors_local)

    def many_banks() -> None:
        import scale_banks

        log(f"{banks} banks of {per_bank}: serve start to first command")
        report["banks"] = scale_banks.measure(banks, per_bank)
        flat[f"serve_first_command_s_{banks}_banks"] = report["banks"]["serve_first_command_s"]
    if "banks" in parts:
        section("banks", many_banks)

    def core() -> None:
        log("bench/core.py: received entries against raw verifications")
        report["core"] = core_ratio(args.quick)
        flat["remote_apply_per_verify"] = report["core"]["remote_apply_per_verify"]
    if "core" in parts:
        section("core", core)
    report["loadavg_end"] = loadavg()
    report["targets"] = {k: {"target": f"{op} {bound}", "value": flat.get(k),
                             "met": None if k not in flat else (flat[k] <= bound if op == "<=" else flat[k] >= bound)}
                         for k, (bound, op) in TARGETS.items()}
    print(f"memmesh scale benchmark  {report['date']}  {report['machine']['cpu']} x{report['machine']['cores']}  "
          f"load {report['loadavg_start']} -> {report['loadavg_end']}" + ("  (--quick)" if args.quick else ""))
    print(f"{'figure':<40}{'value':>12}  target")
    for k, v in flat.items():
        t = report["targets"].get(k)
        mark = "" if t is None else f"{t['target']} {'met' if t['met'] else 'MISSED'}"
        print(f"{k:<40}{v:>12.3f}  {mark}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
