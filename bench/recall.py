"""Recall benchmark of the memory issue, on the full stack.

Usage::

    python bench/recall.py [--quick] [--json PATH] [--queries N] [--seed S] [--time-only] [--time-queries N]

Bench-only dependencies: the ``bench`` extra (``pip install -e .[bench]``: bm25s,
chitchat-dataset); the default embedder is the local ONNX model when the ``embed`` extra is
installed, else the hashed one.

Everything is measured in one run on real components: an SQLite storage file in a temporary
directory, an Ed25519 key, signed entries through ``Database.transaction`` (validation, pycrdt
documents, storage), and a :class:`node.memory.view.MemoryView` subscribed to the database
before the first write (so it is built by its incremental update path, as on a running node).

Corpus (shared with bench/recall_core.py, see bench/_common.py): the first N messages of the
Chit-Chat dataset after a seeded shuffle are the memory values; the key of memory i is an
id-like phrase made of the message's first three words plus ``-n<i>`` (keys are unique, so N
rows = N current memories); each memory has 1-2 tags from a small fixed set. Queries are 2-6
tokens sampled from held-out messages (the last 10,000 shuffled messages, never stored),
joined by spaces. Every memory row carries its hashed-embedder vector (``key + " " + value``)
in the same entry, as ``remember`` stores it.

Build: N in {1k, 10k, 100k} (``--quick``: 1k, 10k), one database per N, ``ROWS_PER_ENTRY``
memories (and their vectors) per signed entry: one entry per memory would take far longer
at 100k and would not change what recall reads. Single-memory writes are measured apart
(``remember_per_s``).

Measured, per N:

* ``recall_p50_ms_bm25_<N>`` / ``recall_p99_ms_bm25_<N>``: ``MemoryView.recall(query)``,
  limit 10, no vector (BM25 only).
* ``recall_p50_ms_hybrid_<N>`` / ``recall_p99_ms_hybrid_<N>``: what MemoryService.recall does
  with the hashed embedder: embed the query (``HashedEmbedder.embed([query])``), then
  ``MemoryView.recall(query, query_vector=...)``; the embedding time is included.
* bm25s (``method="lucene", k1=1.5, b=0.75``) over the same documents (key + value + tags)
  tokenised by our tokenizer, pre-tokenised input, ``retrieve(k=10)``:
  ``top10_identical_frac_<N>`` = share of queries whose top-10 memory ids equal the BM25-only
  recall's top 10 exactly (same ids, same order); ``top10_tie_aware_frac_<N>`` = identical
  except for the order/choice among documents with bitwise-equal float64 scores (as in
  recall_core); ``bm25s_speed_ratio_<N>`` = bm25s p50 retrieve time / our BM25-only recall
  p50 (above 1: we are faster; our time includes tokenising the query string and building
  the Memory list, bm25s gets token ids).

Opening a node, per N (what every ``memmesh`` CLI command pays, a fresh process each):
``db_open_s_<N>`` = ``Database.open`` of the database from its SQLite file (a second
connection to the file just written; decodes and verifies nothing new, rebuilds the derived
state), ``view_build_s_<N>`` = building a :class:`MemoryView` (hashed store and dim) over
that already-open database, i.e. the wait of the first recall after opening; Database.open is
not included. Median of ``OPEN_REPEATS`` runs, each on a new Database and storage.

And once: ``remember_per_s`` (one memory + its vector per signed entry, as
MemoryService.remember writes it, into a fresh database with a view attached),
``embed_texts_per_s_default`` / ``embed_texts_per_s_hashed`` (batches of 32), and
``rss_mb_per_100k`` (VmRSS after minus before building the largest database with its view,
scaled to 100k memories; ``--quick`` scales from 10k).

Time-aware recall (issue 10), per N, over a second database: a bank *with a history*
(:func:`build_history`: N keys as base rows, then revisions valid from later dates, corrections,
merge rows retiring facts with ``valid_to``, and tombstones, i.e. rows of other keys superseding
a key; about 1.6 N rows). Each case runs as the recall tool runs it, ``RecallArgs`` ->
``filters(now)`` -> ``MemoryView.recall(limit=10)``, the query embedded as above, on the first
``--time-queries`` queries (default 100: these cases are slow): ``now_hybrid`` (no time
argument), ``as_of_hybrid`` / ``as_of_bm25`` / ``as_of_newest`` (a world time uniform over the
history's span; no query for ``newest``), ``as_known_at_hybrid`` (an entry drawn per query),
``as_known_at_anchor_hybrid`` (one entry for every query), ``as_known_at_newest``,
``as_known_at_and_as_of_hybrid``; ``as_of_first_s`` (the first as_of recall after the history
was fed row by row: the timeline arrays are ordered then), ``as_of_after_write`` (one remember,
then one as_of recall) and ``as_known_at_after_write`` (as known at an entry just written). Every
as_of result is checked to be the row that held at the asked time, every as_known_at result to
be its key's current row (or the row that held then) in the entry's causal past, and a few
no-query answers are compared whole with the ten newest of a reference set; the references are
the timeline rules applied key by key in Python with ``Database.precedes``, none of the view's
arrays. Also per size: VmRSS of the history database with its view, and the time and memory of a
second view built by rebuild; the neighbors tool (:func:`bench_neighbors`) at depth 1 and 2 on a
home whose agent holds N memories with typed edges (and a second agent with N/10), its depth-1
answers checked against a scan of every current row. The as_known_at cases run when RecallArgs
has that argument, else the JSON says they were not measured. ``--time-only`` runs only these.

Timing hygiene as in recall_core: 20 warm-up queries and ``gc.collect(); gc.freeze()`` before
each timed loop; ``OPENBLAS_NUM_THREADS=1`` is set before numpy loads (steadier p99 on a
small shared machine). Prints a table; ``--json PATH`` writes every figure.
"""

from __future__ import annotations

import os

# Before numpy (imported below, directly and by every project module): one BLAS thread.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ.setdefault("DISABLE_TQDM", "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import sqlite3  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from importlib.metadata import PackageNotFoundError, version  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from _common import (  # noqa: E402
    HELD_OUT,
    bm25s_index,
    bm25s_query_ids,
    bm25s_retrieve_fn,
    compare_top10,
    exact_scores,
    load_messages,
    make_queries,
    need,
    pct,
    timed,
)
from core import machine  # noqa: E402

from memmesh.auth.keys import SigningKey  # noqa: E402
from memmesh.crdt.database import Database  # noqa: E402
from memmesh.node.commands.tools import RecallArgs  # noqa: E402
from memmesh.node.memory.bm25 import InvertedIndex  # noqa: E402
from memmesh.node.memory.embedders import EmbedderConfig, HashedEmbedder, default_provider, make_embedder  # noqa: E402
from memmesh.node.memory.heap import release_freed_memory  # noqa: E402
from memmesh.node.memory.rows import MEMORY_STORE, check_time, embedding_value, iso_utc, memory_value  # noqa: E402
from memmesh.node.memory.timeline import current_in, held_at  # noqa: E402
from memmesh.node.memory.tokens import document_text, tokenize  # noqa: E402
from memmesh.node.memory.view import MemoryView  # noqa: E402
from memmesh.node.storage import SqliteStorage  # noqa: E402

SIZES = {1_000: "1k", 10_000: "10k", 100_000: "100k"}
ROWS_PER_ENTRY = 200
OPEN_REPEATS = 3
TAGS = ("chat", "personal", "work", "ideas", "todo", "family")
KEY_WORDS = 3
EMBED_BATCH = 32
TARGET_HYBRID_P99_MS = 50.0
TARGET_TOP10_IDENTICAL = 0.99

Mem = tuple[str, str, list[str]]  # (key, value, tags)


def log(msg: str, t0: float = time.perf_counter()) -> None:
    print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def rss_mib() -> float:
    """Resident set size of this process (VmRSS), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def trimmed_rss_mib() -> float:
    """VmRSS after a full collection and after giving freed heap back to the OS."""
    gc.collect()
    release_freed_memory()
    return rss_mib()


def full_gc_ms() -> float:
    """Time of one full collection of what is alive now (garbage collected first)."""
    gc.collect()
    t = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - t) * 1e3


def git_state() -> dict:
    """Commit of the tree and library files changed since (other work may be in progress)."""
    def run(*cmd: str) -> str:
        try:
            return subprocess.run(["git", *cmd], cwd=HERE.parent, capture_output=True, text=True,
                                  timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return ""
    # "XY path" lines: the path starts at column 3, so the output is not stripped first.
    dirty = [line[3:] for line in run("status", "--porcelain", "--", "auth", "crdt", "node").splitlines()
             if line.strip()]
    return {"commit": run("rev-parse", "HEAD").strip() or None, "library_files_changed": dirty}


def make_memories(msgs: list[str], seed: int) -> list[Mem]:
    """Memory i: key = first words of message i + "-n<i>" (unique), value = the message, 1-2 tags."""
    rnd = random.Random(seed)
    out: list[Mem] = []
    for i, msg in enumerate(msgs):
        words = [w[:24] for w in tokenize(msg)[:KEY_WORDS]] or ["note"]
        tags = rnd.sample(TAGS, rnd.randint(1, 2))
        out.append(("-".join(words) + f"-n{i:06d}", msg, tags))
    return out


def open_db(tmp: Path, name: str, hashed: HashedEmbedder):
    storage = SqliteStorage(tmp / f"{name}.sqlite")
    key = SigningKey.generate()
    db = Database.create(storage, key, meta={"kind": "bank", "display_name": name})
    view = MemoryView(db, embedding_store=hashed.store_name, dim=hashed.dim)
    return storage, key, db, view


def build(tmp: Path, mems: list[Mem], n: int, hashed: HashedEmbedder) -> dict:
    """A database of ``n`` memories, ROWS_PER_ENTRY memories (+ vectors) per signed entry."""
    storage, key, db, view = open_db(tmp, f"recall-{n}", hashed)
    embed_s = 0.0
    entries = 0
    t0 = time.perf_counter()
    for start in range(0, n, ROWS_PER_ENTRY):
        rows = [memory_value(k, v, tags) for k, v, tags in mems[start:min(n, start + ROWS_PER_ENTRY)]]
        te = time.perf_counter()
        vectors = hashed.embed([f"{r['key']} {r['value']}" for r in rows])
        embed_s += time.perf_counter() - te
        txn = db.transaction(key)
        for row, vec in zip(rows, vectors):
            row_key = txn.append(MEMORY_STORE, row)
            txn.append(hashed.store_name, embedding_value(row_key, vec))
        txn.commit()
        entries += 1
    build_s = time.perf_counter() - t0
    if len(view) != n:
        raise SystemExit(f"recall: the view holds {len(view)} current memories, expected {n}")
    return {
        "storage": storage, "key": key, "db": db, "view": view,
        "stats": {
            "entries": entries,
            "build_s": build_s,
            "embed_s": embed_s,
            "memories_per_s": n / build_s,
            "db_file_mb": os.path.getsize(storage.path) / 2**20,
        },
    }


def time_open(path: str, db_id: str, n: int, hashed: HashedEmbedder, repeats: int = OPEN_REPEATS) -> dict:
    """``Database.open`` of the SQLite file, then a MemoryView over the open database (timed apart)."""
    opens, views = [], []
    for _ in range(repeats):
        gc.collect()
        storage = SqliteStorage(path)
        t = time.perf_counter()
        db = Database.open(storage, db_id)
        opens.append(time.perf_counter() - t)
        t = time.perf_counter()
        view = MemoryView(db, embedding_store=hashed.store_name, dim=hashed.dim)
        views.append(time.perf_counter() - t)
        if len(view) != n:
            raise SystemExit(f"recall: the reopened view holds {len(view)} current memories, expected {n}")
        view.close()
        storage.close()
        del view, db, storage
    return {"db_open_s": float(np.median(opens)), "view_build_s": float(np.median(views)),
            "db_open_samples_s": opens, "view_build_samples_s": views, "repeats": repeats}


def remember_fn(db: Database, key: SigningKey, hashed: HashedEmbedder):
    """MemoryService.remember without agent/bank resolution: one signed entry per memory."""

    def remember(k: str, v: str, tags: list[str]) -> str:
        row = memory_value(k, v, tags)
        vector = hashed.embed([f"{row['key']} {row['value']}"])[0]
        txn = db.transaction(key)
        row_key = txn.append(MEMORY_STORE, row)
        txn.append(hashed.store_name, embedding_value(row_key, vector))
        return txn.commit()

    return remember


def time_writes(remember, items: list[Mem], warmup: int = 20) -> dict:
    for k, v, tags in items[:warmup]:
        remember(k + "-warm", v, tags)
    gc.collect()
    samples = []
    t0 = time.perf_counter()
    for k, v, tags in items:
        t = time.perf_counter_ns()
        remember(k, v, tags)
        samples.append(time.perf_counter_ns() - t)
    total = time.perf_counter() - t0
    return {"n": len(items), "per_s": len(items) / total, **pct(samples)}


def bench_size(n: int, built: dict, mems: list[Mem], doc_tokens: list[list[str]], queries: list[list[str]],
               hashed: HashedEmbedder, bm25s) -> dict:
    view: MemoryView = built["view"]
    out: dict = {"n_memories": n, "n_queries": len(queries), "build": built["stats"]}
    qstrs = [(" ".join(q),) for q in queries]

    # One full collection over everything alive, node included (before anything is frozen).
    out["full_gc_ms"] = full_gc_ms()

    def bm25_only(q: str):
        return view.recall(q, limit=10)

    def hybrid(q: str):  # as MemoryService._search: embed the query, then rank
        vec = hashed.embed([q])[0] if q.strip() and view.has_vectors() else None
        return view.recall(q, limit=10, query_vector=vec)

    found, out["recall_bm25"] = timed(bm25_only, qstrs)
    hyb, out["recall_hybrid"] = timed(hybrid, qstrs)
    _, out["query_embed_hashed"] = timed(lambda q: hashed.embed([q]), qstrs)
    out["mean_results_bm25"] = sum(map(len, found)) / len(found)
    out["mean_results_hybrid"] = sum(map(len, hyb)) / len(hyb)

    # bm25s on the same documents and tokens.
    t = time.perf_counter()
    retriever, vocab = bm25s_index(bm25s, doc_tokens[:n])
    out["bm25s_build_s"] = time.perf_counter() - t
    b_results, out["bm25s_retrieve10"] = timed(bm25s_retrieve_fn(retriever, n),
                                               [(qi,) for qi in bm25s_query_ids(vocab, queries)])
    del retriever

    # Our exact float64 scores per corpus index, for the tie-aware comparison.
    ref = InvertedIndex()
    for i, toks in enumerate(doc_tokens[:n]):
        ref.add(i, toks)
    index_of = {mems[i][0]: i for i in range(n)}
    cmp = []
    for q, mine, (b_ids, b_scores) in zip(queries, found, b_results):
        exact = exact_scores(ref, q)
        ours = [(index_of[m.key], exact.get(index_of[m.key], 0.0)) for m in mine]
        cmp.append(compare_top10(ref, q, ours, b_ids, b_scores, exact=exact))
    nq = len(cmp)
    out["top10_identical"] = sum(c["strict"] for c in cmp) / nq
    out["top10_same_set"] = sum(c["set"] for c in cmp) / nq
    out["top10_tie_aware"] = sum(c["tie"] for c in cmp) / nq
    out["top10_tie_aware_f32"] = sum(c["tie32"] for c in cmp) / nq
    out["max_rel_score_diff"] = max(c["max_rel"] for c in cmp)
    out["bm25s_speed_ratio"] = out["bm25s_retrieve10"]["p50_ms"] / out["recall_bm25"]["p50_ms"]
    out["disagreements_tie_aware"] = [
        {"query": " ".join(q), "ours": [index_of[m.key] for m in mine], "bm25s": [int(x) for x in bi]}
        for q, mine, (bi, _), c in zip(queries, found, b_results, cmp) if not c["tie"]
    ][:5]
    return out


# --------------------------------------------------------------------- time-aware recall
# A bank with a history (issue 10): keys with several rows, world-time validity, retired facts
# and tombstones, then recall "as of" a world time and "as known at" an entry, as the recall tool
# runs them (RecallArgs -> Filters -> MemoryView.recall).
DAY_MS = 86_400_000
WORLD_T0 = 1_735_689_600_000  # 2025-01-01T00:00:00Z, ms since the epoch
WORLD_SPAN_DAYS = 730  # world times of the history and of the as_of queries: 2025-2026
P_VALID_FROM = 0.5  # base rows with a valid_from (the others hold from the start)
P_REVISED = 0.25  # keys with 1-3 later rows (a new value each, valid from a later date)
P_CORRECTION = 0.1  # revisions without valid_from: a correction that answers for every time
P_RETIRED = 0.08  # keys whose current row is retired by a merge row with valid_to
P_TOMBSTONED = 0.02  # keys retired by another key's row (a supersedes edge)
CATEGORIES = ("fact", "decision", "preference", "lesson")
AFTER_WRITE_SAMPLES = 20  # a remember, then a time-aware recall (nothing is rebuilt)
COMPLETE_CHECKS = 5  # no-query calls whose whole answer is checked against the Python reference
TARGET_TIME_P99_MS = 50.0
TIME_CASES = ("now_hybrid", "as_of_hybrid", "as_of_bm25", "as_of_newest", "as_known_at_hybrid",
              "as_known_at_anchor_hybrid", "as_known_at_newest", "as_known_at_and_as_of_hybrid")
TIME_TARGET_CASES = ("as_of_hybrid", "as_known_at_hybrid", "as_known_at_anchor_hybrid")


def build_history(tmp: Path, mems: list[Mem], pool: list[str], n: int, hashed: HashedEmbedder,
                  seed: int) -> dict:
    """A bank of ``n`` keys with a history, written phase by phase (ROWS_PER_ENTRY rows per
    entry, vectors in the same entry): base rows; revision rounds 1-3; merge rows retiring
    facts with valid_to; rows of other keys superseding keys (tombstones). Later rows carry the
    ``supersedes`` edge to the row they replace, as ``remember`` writes them."""
    rnd = random.Random(seed)
    storage, key, db, view = open_db(tmp, f"history-{n}", hashed)
    entry_of: dict[str, str] = {}  # memory key -> entry of its newest row
    last: dict[str, dict] = {}  # memory key -> its newest row's value
    entries: list[str] = []
    pool_at = iter(range(10**9))
    count = {"rows": 0, "valid_from": 0, "valid_to": 0, "revisions": 0, "corrections": 0,
             "retired": 0, "tombstoned": 0}

    def world(lo_days: int = 0, hi_days: int = WORLD_SPAN_DAYS // 2) -> int:
        return WORLD_T0 + rnd.randrange(lo_days * DAY_MS, hi_days * DAY_MS)

    def write(rows: list[dict]) -> None:
        for start in range(0, len(rows), ROWS_PER_ENTRY):
            chunk = rows[start:start + ROWS_PER_ENTRY]
            vectors = hashed.embed([f"{r['key']} {r['value']}" for r in chunk])
            txn = db.transaction(key)
            for row, vec in zip(chunk, vectors):
                row_key = txn.append(MEMORY_STORE, row)
                txn.append(hashed.store_name, embedding_value(row_key, vec))
            eid = txn.commit()
            entries.append(eid)
            for row in chunk:
                entry_of[row["key"]] = eid
                last[row["key"]] = row
            count["rows"] += len(chunk)
            count["valid_from"] += sum("valid_from" in r for r in chunk)
            count["valid_to"] += sum("valid_to" in r for r in chunk)

    def replaces(k: str) -> dict:
        return {"type": "supersedes", "to": k, "entry": entry_of[k]}

    t0 = time.perf_counter()
    keys = [k for k, _, _ in mems[:n]]
    base = []
    for k, v, tags in mems[:n]:
        extra = {}
        if rnd.random() < P_VALID_FROM:
            extra["valid_from"] = iso_utc(world())
        if rnd.random() < 0.6:
            extra["category"] = rnd.choice(CATEGORIES)
            extra["confidence"] = rnd.randint(1, 10)
        base.append(memory_value(k, v, tags, **extra))
    write(base)

    revised = {k: rnd.randint(1, 3) for k in keys if rnd.random() < P_REVISED}
    for rnd_no in (1, 2, 3):
        rows = []
        for k, times in revised.items():
            if times < rnd_no:
                continue
            prev = last[k]
            extra = {k2: prev[k2] for k2 in ("category", "confidence") if k2 in prev}
            if rnd.random() < P_CORRECTION:
                count["corrections"] += 1
            else:
                since = check_time("valid_from", prev["valid_from"]) if "valid_from" in prev else world()
                extra["valid_from"] = iso_utc(since + rnd.randrange(DAY_MS, 120 * DAY_MS))
            value = pool[next(pool_at) % len(pool)]
            rows.append(memory_value(k, value, prev["tags"], edges=[replaces(k)], **extra))
            count["revisions"] += 1
        write(rows)

    rows = []
    for k in keys:
        if rnd.random() < P_RETIRED:
            cur = last[k]
            since = check_time("valid_from", cur["valid_from"]) if "valid_from" in cur else world()
            extra = {k2: cur[k2] for k2 in ("category", "confidence", "valid_from") if k2 in cur}
            rows.append(memory_value(k, cur["value"], cur["tags"], edges=[replaces(k)],
                                     valid_to=iso_utc(since + rnd.randrange(DAY_MS, 300 * DAY_MS)), **extra))
            count["retired"] += 1
    write(rows)

    # Tombstones: a new row of key j (each j once) supersedes key k as well as j's own row.
    doomed = [k for k in keys if rnd.random() < P_TOMBSTONED]
    doomed_set = set(doomed)
    successors = iter(rnd.sample([k for k in keys if k not in doomed_set], len(doomed)))
    rows = []
    for k in doomed:
        j = next(successors)
        value = pool[next(pool_at) % len(pool)]
        rows.append(memory_value(j, value, last[j]["tags"], edges=[replaces(k), replaces(j)],
                                 valid_from=iso_utc(world(0, WORLD_SPAN_DAYS))))
        count["tombstoned"] += 1
    write(rows)
    build_s = time.perf_counter() - t0
    if len(view) != n - count["tombstoned"]:
        raise SystemExit(f"recall: the history view holds {len(view)} current memories, "
                         f"expected {n - count['tombstoned']}")
    return {"storage": storage, "key": key, "db": db, "view": view, "entries": entries,
            "stats": {"keys": n, "entries": len(entries), "build_s": build_s,
                      "keys_with_several_rows": len(revised) + count["retired"], **count,
                      "current_memories": len(view)}}


def as_known_at_supported() -> bool:
    """Whether the recall tool takes ``as_known_at`` yet (issue 10 item 3; being written)."""
    return "as_known_at" in RecallArgs.model_fields


def bench_time(n: int, built: dict, queries: list[list[str]], hashed: HashedEmbedder, seed: int) -> dict:
    """as_of / as_known_at recall over a history database, as the recall tool runs it:
    ``RecallArgs(...).filters(now)`` (parsing the ISO time, as the tool does), the query
    embedded when it has words, then ``MemoryView.recall(..., filters=...)``."""
    view: MemoryView = built["view"]
    rnd = random.Random(seed)
    now = WORLD_T0 + (WORLD_SPAN_DAYS + 1) * DAY_MS  # a fixed clock after the whole history
    qstrs = [" ".join(q) for q in queries]
    times = [iso_utc(WORLD_T0 + rnd.randrange(WORLD_SPAN_DAYS * DAY_MS)) for _ in queries]
    known = [rnd.choice(built["entries"]) for _ in queries]
    out: dict = {"n_keys": n, "n_queries": len(queries), "build": built["stats"], "now": iso_utc(now),
                 "as_of_times": f"uniform over {iso_utc(WORLD_T0)} + {WORLD_SPAN_DAYS} days"}

    def recall(args: dict, embed: bool = True):
        filters = RecallArgs.model_validate(args).filters(now)
        q = args.get("query", "")
        vec = hashed.embed([q])[0] if embed and q.strip() and view.has_vectors() else None
        return view.recall(q, limit=10, query_vector=vec, filters=filters)

    # The references: the timeline rules applied key by key in Python (node.memory.timeline),
    # the causal past by Database.precedes, nothing of the view's arrays or masks.
    db = built["db"]

    def in_past(m, entry: str) -> bool:
        return m.entry_id == entry or db.precedes(m.entry_id, entry)

    def ref_held(key: str, t: int):
        return held_at(key, view.timeline(key), t)

    def ref_known(key: str, entry: str, as_of: str | None):
        timeline = [m for m in view.timeline(key) if in_past(m, entry)]
        if not any(m.key == key for m in timeline):
            return None
        if as_of is not None:
            return held_at(key, timeline, check_time("as_of", as_of))
        m = current_in(key, timeline)
        # The caller's clock hides a fact whose valid_to has passed (recall without as_of).
        return None if m is None or (m.valid_to is not None and m.valid_to <= now) else m

    def ref_all(picked):
        """The ten newest of the rows picked per key (None: nothing for that key)."""
        return sorted((m for m in picked if m is not None), key=lambda m: m.order, reverse=True)[:10]

    keys_of_view = sorted({m.key for m in view.memories(include_superseded=True)})

    # The first as_of recall after any change of the database builds the index over every row.
    t = time.perf_counter()
    recall({"query": qstrs[0], "as_of": times[0]})
    out["as_of_first_s"] = time.perf_counter() - t

    cases = {
        "now_hybrid": [({"query": q},) for q in qstrs],
        "as_of_hybrid": [({"query": q, "as_of": w},) for q, w in zip(qstrs, times)],
        "as_of_bm25": [({"query": q, "as_of": w}, False) for q, w in zip(qstrs, times)],
        "as_of_newest": [({"as_of": w},) for w in times],
    }
    if as_known_at_supported():
        # A different entry per query (each past computed afresh: the view caches a few), and
        # one anchor entry for every query (a session pinned to one point of causal time).
        anchor = built["entries"][len(built["entries"]) // 2]
        cases["as_known_at_hybrid"] = [({"query": q, "as_known_at": e},) for q, e in zip(qstrs, known)]
        cases["as_known_at_anchor_hybrid"] = [({"query": q, "as_known_at": anchor},) for q in qstrs]
        cases["as_known_at_newest"] = [({"as_known_at": e},) for e in known]
        cases["as_known_at_and_as_of_hybrid"] = [({"query": q, "as_known_at": e, "as_of": w},)
                                                 for q, e, w in zip(qstrs, known, times)]
    else:
        out["as_known_at"] = "not measured: the recall tool (RecallArgs) has no as_known_at argument yet"
    for name, args in cases.items():
        try:
            found, out[name] = timed(recall, args)
        except Exception as exc:  # noqa: BLE001 - a case the product refuses is reported, not fatal
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        out[name]["mean_results"] = sum(map(len, found)) / len(found)
        if name in ("as_of_hybrid", "as_of_newest"):
            # Every result must be the row of its key that held at the asked time.
            wrong = sum(ref_held(m.key, check_time("as_of", a["as_of"])) != m
                        for (a, *_), ms in zip(args, found) for m in ms)
            out[name]["results_not_held_then"] = wrong
            if wrong:
                raise SystemExit(f"recall: {wrong} {name} results did not hold at the asked time")
        if name in ("as_known_at_hybrid", "as_known_at_newest", "as_known_at_and_as_of_hybrid"):
            # Every result must be its key's current row (or, with as_of, the row that held
            # then) among the rows of the entry's causal past.
            wrong = sum(ref_known(m.key, a["as_known_at"], a.get("as_of")) != m
                        for (a, *_), ms in zip(args, found) for m in ms)
            out[name]["results_not_current_then"] = wrong
            if wrong:
                raise SystemExit(f"recall: {wrong} {name} results were not current in the entry's past")
    # Completeness, on a few no-query calls (newest first): the whole answer equals the ten
    # newest of the reference set, computed key by key in Python.
    complete = 0
    for w, e in zip(times[:COMPLETE_CHECKS], known[:COMPLETE_CHECKS]):
        t = check_time("as_of", w)
        for args_, want in (({"as_of": w}, ref_all([ref_held(k, t) for k in keys_of_view])),
                            ({"as_known_at": e}, ref_all([ref_known(k, e, None) for k in keys_of_view]))):
            got = recall(args_)
            if got != want:
                raise SystemExit(f"recall: {args_} returned {[m.key for m in got]}, the reference "
                                 f"{[m.key for m in want]}")
            complete += 1
    out["complete_answers_checked"] = complete
    gc.unfreeze()
    out["keys_held_at_mean"] = float(np.mean([len(view.held_at(check_time("as_of", w))) for w in times[:20]]))

    # A live node writes between recalls; every index follows the new row, nothing is
    # rebuilt. One remember, then one timed as_of recall and one as_known_at recall as known
    # at the entry just written (a past never asked about), a few times.
    remember = remember_fn(built["db"], built["key"], hashed)
    after: dict[str, list[int]] = {"as_of_after_write": [], "as_known_at_after_write": []}
    for i in range(AFTER_WRITE_SAMPLES):
        entry = remember(f"late-write-{i}", f"written between two time-aware recalls {i}", ["todo"])
        t = time.perf_counter_ns()
        recall({"query": qstrs[i], "as_of": times[i]})
        after["as_of_after_write"].append(time.perf_counter_ns() - t)
        remember(f"late-write-{i}-b", f"and another one {i}", ["todo"])
        t = time.perf_counter_ns()
        got = recall({"query": qstrs[i], "as_known_at": entry})
        after["as_known_at_after_write"].append(time.perf_counter_ns() - t)
        if any(ref_known(m.key, entry, None) != m for m in got):
            raise SystemExit("recall: an as_known_at result after a write was not current in the entry's past")
    for name, samples in after.items():
        out[name] = {**pct(samples), "n": len(samples)}
    out["view_sizes"] = view.sizes()
    return out

# ------------------------------------------------------------------------ neighbors
NEIGHBOR_TYPES = ("see", "depends-on", "about")
NEIGHBOR_QUERIES = 200
NEIGHBOR_CHECKS = 5  # starts whose depth-1 answer is checked against a scan of every current row


def bench_neighbors(tmp: Path, mems: list[Mem], n: int, seed: int) -> dict:
    """The neighbors tool on a real home: agent alpha's memory of ``n`` memories and agent
    beta's of ``n // 10`` (alpha may read it), each memory with 0-3 typed edges to a random key
    of its own memory (70 %), of the other one as ``BANK:KEY`` (20 %) or to a key that does not
    exist (10 %); ROWS_PER_ENTRY rows per signed entry. Timed: ``node.call_tool("alpha",
    "neighbors", {"key": k, "depth": d})`` from random keys, d = 1 and 2, after a warm-up (the
    first call builds both views). Checked: the depth-1 neighbours of a few starts equal what a
    scan of every current row of both memories finds."""
    from memmesh.node import Node
    from memmesh.node.memory.backlinks import split_target

    rnd = random.Random(seed)
    tmp.mkdir(parents=True, exist_ok=True)
    node = Node.open(tmp / "neighbors-home")
    try:
        node.set_embedder_config(EmbedderConfig("none"))
        node.agents.create_agent("alpha")
        node.agents.create_agent("beta")
        node.run("memory.grant", {"bank": "beta", "agent": "alpha", "perm": "read"})
        sizes = {"alpha": n, "beta": max(1, n // 10)}
        keys = {name: [k for k, _, _ in mems[:size]] for name, size in sizes.items()}
        t0 = time.perf_counter()
        n_edges = 0
        for name, size in sizes.items():
            other = "beta" if name == "alpha" else "alpha"
            agent = node.agents.agent(name)
            for start in range(0, size, ROWS_PER_ENTRY):
                txn = agent.db.transaction(agent.key)
                for k, v, tags in mems[start:min(size, start + ROWS_PER_ENTRY)]:
                    edges = []
                    for _ in range(rnd.randint(0, 3)):
                        r = rnd.random()
                        to = (rnd.choice(keys[name]) if r < 0.7 else
                              f"{other}:{rnd.choice(keys[other])}" if r < 0.9 else f"ghost-{rnd.randrange(10**6)}")
                        edges.append({"type": rnd.choice(NEIGHBOR_TYPES), "to": to})
                    unique = list(dict.fromkeys((e["type"], e["to"]) for e in edges))
                    row = memory_value(k, v, tags, edges=[{"type": t, "to": to} for t, to in unique] or None)
                    n_edges += len(row.get("edges", []))
                    txn.append(MEMORY_STORE, row)
                txn.commit()
        build_s = time.perf_counter() - t0
        starts = [rnd.choice(keys["alpha"]) for _ in range(NEIGHBOR_QUERIES)]

        def call(k: str, depth: int):
            return node.call_tool("alpha", "neighbors", {"key": k, "depth": depth})

        t = time.perf_counter()
        call(starts[0], 1)
        first_s = time.perf_counter() - t
        out: dict = {"memories": sizes, "edges": n_edges, "build_s": build_s, "first_call_s": first_s}
        for depth in (1, 2):
            found, out[f"depth_{depth}"] = timed(call, [(k, depth) for k in starts])
            out[f"depth_{depth}"]["mean_neighbors"] = sum(r["count"] for r in found) / len(found)
        gc.unfreeze()

        # The reference: every current row of both memories, each link resolved, both directions.
        ids = {name: node.agents.agent(name).db.id for name in sizes}
        resolve = dict(ids).get
        links: set[tuple[str, str, str, str]] = set()  # (from db, from key, to db, to key)
        for name, db_id in ids.items():
            for m in node.memory.view(node.agents.agent(name).db).memories():
                for e in m.edges:
                    if e.type == "supersedes":
                        continue
                    to_db, to_key = split_target(e.to, resolve)
                    links.add((db_id, m.key, to_db or db_id, to_key))
        current = {(db_id, m.key) for name, db_id in ids.items()
                   for m in node.memory.view(node.agents.agent(name).db).memories()}
        for k in starts[:NEIGHBOR_CHECKS]:
            me = (ids["alpha"], k)
            want = {(b, kk) for a, ak, b, kk in links if (a, ak) == me} | {(a, ak) for a, ak, b, kk in links
                                                                          if (b, kk) == me}
            want = {x for x in want if x in current and x != me}
            names = {v: name for name, v in ids.items()}
            got = {(ids[m["bank"]], m["key"]) for m in call(k, 1)["neighbors"]}
            if got != want:
                raise SystemExit(f"neighbors: from {k} found {sorted(got)}, the scan {sorted(want)} ({names})")
        out["checked_starts"] = NEIGHBOR_CHECKS
        return out
    finally:
        node.close()


def bench_embed(embedder, texts: list[str], one_call: bool = False) -> dict:
    t = time.perf_counter()
    embedder.embed(texts[:EMBED_BATCH])  # loads the model (local); warms caches
    first_s = time.perf_counter() - t
    t = time.perf_counter()
    for i in range(0, len(texts), EMBED_BATCH):
        embedder.embed(texts[i:i + EMBED_BATCH])
    secs = time.perf_counter() - t
    out = {"provider": embedder.provider, "model": embedder.model, "dim": embedder.dim,
           "texts": len(texts), "batch": EMBED_BATCH, "texts_per_s": len(texts) / secs,
           "first_call_s": first_s}
    if one_call:
        # All texts in one call: the local embedder sorts by length before batching by 32, so
        # less padding (a batch is padded to its longest text).
        t = time.perf_counter()
        embedder.embed(texts)
        out["texts_per_s_one_call"] = len(texts) / (time.perf_counter() - t)
    return out


def versions(bm25s) -> dict:
    out = {"numpy": np.__version__, "bm25s": getattr(bm25s, "__version__", "?"),
           "sqlite": sqlite3.sqlite_version}
    for mod in ("pycrdt", "onnxruntime", "tokenizers"):
        try:
            out[mod] = version(mod)
        except PackageNotFoundError:
            out[mod] = None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1k and 10k memories only, fewer writes (a smoke run)")
    ap.add_argument("--json", type=Path, help="write all figures to this file")
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--time-only", action="store_true",
                    help="only the time-aware cases (as_of, as_known_at over a bank with a history)")
    ap.add_argument("--time-queries", type=int, default=100,
                    help="queries per time-aware case (the first N of --queries; these cases are slow)")
    args = ap.parse_args(argv)
    bm25s = need("bm25s", "bm25s", "recall")

    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    n_max = max(sizes)
    n_remember = 500 if args.quick else 2000
    n_embed = 256 if args.quick else 1024

    msgs = load_messages(args.seed)
    if len(msgs) < n_max + HELD_OUT:
        sys.exit("recall: dataset too small")
    mems = make_memories(msgs[:n_max], args.seed + 7)
    doc_tokens = [tokenize(document_text(k, v, tags)) for k, v, tags in mems]
    held_out_msgs = msgs[-HELD_OUT:]
    held_out = [tokenize(m) for m in held_out_msgs]
    queries = make_queries(held_out, args.queries, random.Random(args.seed + 1))
    revision_values = msgs[n_max:len(msgs) - HELD_OUT]  # never stored as base rows, never queried
    del msgs
    hashed = HashedEmbedder()
    log(f"corpus ready: {n_max} memories, {len(queries)} queries")

    report: dict = {
        "bench": "recall",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {**machine(), "nproc": len(os.sched_getaffinity(0))},
        "python": sys.version.split()[0],
        "versions": versions(bm25s),
        "git": git_state(),
        "quick": args.quick,
        "seed": args.seed,
        "n_queries": len(queries),
        "openblas_num_threads": os.environ["OPENBLAS_NUM_THREADS"],
        "openblas_note": "OPENBLAS_NUM_THREADS=1 set by the script before numpy loads",
        "timing": "per query: perf_counter_ns around the call; 20 warm-up queries, then "
                  "gc.collect()+gc.freeze() before each timed loop (as bench/recall_core.py)",
        "corpus": {
            "source": "chitchat-dataset messages, seeded shuffle (bench/_common.load_messages)",
            "key": f"first {KEY_WORDS} words of the message joined by '-' + '-n<index>' (unique keys; "
                   "the n<index> tokens add N unique tokens to the BM25 vocabulary)",
            "tags": f"1-2 of {list(TAGS)}",
            "queries": "2-6 tokens of a held-out message (bench/_common.make_queries), joined by spaces",
            "held_out": HELD_OUT,
        },
        "build": {
            "rows_per_entry": ROWS_PER_ENTRY,
            "vectors": f"{hashed.provider}/{hashed.model} (dim {hashed.dim}), in the same entry as their rows",
            "storage": "SqliteStorage (WAL, synchronous=NORMAL) in a temporary directory",
            "signing": "Ed25519, Database.transaction(...).commit() per entry",
            "view": "MemoryView subscribed before the first write (incremental updates)",
            "open": f"db_open_s / view_build_s: median of {OPEN_REPEATS} x (new SqliteStorage on the file, "
                    "Database.open timed, then MemoryView(hashed store, dim) timed apart: the view's bulk rebuild)",
            "one_database_per_size": True,
            "order": "largest size first (its RSS is measured before any other database existed in the process), then the others",
        },
        "sizes": {},
    }

    if not args.time_only:
        with tempfile.TemporaryDirectory(prefix="memmesh-recall-") as tmp_name:
            tmp = Path(tmp_name)
            for n in sorted(sizes, reverse=True):
                label = SIZES[n]
                rss = {}
                gc_base_ms = full_gc_ms()
                if n == n_max:
                    gc.collect()
                    rss["before_mb"] = rss_mib()
                built = build(tmp, mems, n, hashed)
                log(f"built {label}: {built['stats']['entries']} entries in {built['stats']['build_s']:.1f}s")
                if n == n_max:
                    gc.collect()
                    rss["after_mb"] = rss_mib()
                    rss["delta_mb"] = rss["after_mb"] - rss["before_mb"]
                    # Breakdown: a second view over the same database, built by rebuild (as on open).
                    gc.collect()
                    r0 = rss_mib()
                    t = time.perf_counter()
                    extra = MemoryView(built["db"], embedding_store=hashed.store_name, dim=hashed.dim)
                    rss["view_rebuild_s"] = time.perf_counter() - t
                    gc.collect()
                    rss["second_view_mb"] = rss_mib() - r0
                    built["stats"]["view_rebuild_s"] = rss["view_rebuild_s"]
                    extra.close()
                    del extra
                    gc.collect()
                opened = time_open(built["storage"].path, built["db"].id, n, hashed)
                log(f"opened {label}: Database.open {opened['db_open_s']:.2f}s, view {opened['view_build_s']:.2f}s")
                r = bench_size(n, built, mems, doc_tokens, queries, hashed, bm25s)
                r["open"] = opened
                r["full_gc_ms_bench_data"] = gc_base_ms
                r["full_gc_ms_node"] = r["full_gc_ms"] - gc_base_ms
                if rss:
                    r["rss"] = rss
                if n == n_max and not args.quick:
                    # Writes into the full database (the view updates a 100k index).
                    items = [(f"{k}-late", v, tags) for k, v, tags in mems[:200]]
                    r["remember_into_this_db"] = time_writes(remember_fn(built["db"], built["key"], hashed), items)
                report["sizes"][label] = r
                built["view"].close()
                built["storage"].close()
                del built
                gc.unfreeze()
                gc.collect()
                log(f"measured {label}")

            storage, key, db, view = open_db(tmp, "remember", hashed)
            report["remember"] = time_writes(remember_fn(db, key, hashed), mems[:n_remember])
            report["remember"]["database"] = "fresh database with a MemoryView attached, one entry per memory"
            view.close()
            storage.close()
            log("measured remember")

        texts = [f"{' '.join(t[:3])} {m}" for t, m in zip(held_out, held_out_msgs)][:n_embed]
        default = make_embedder(EmbedderConfig(default_provider()))
        report["embed_default"] = (bench_embed(default, texts, one_call=default.provider == "local")
                                   if default is not None else None)
        report["embed_hashed"] = bench_embed(hashed, texts)
        log("measured embedders")

    report["time_aware"] = {
        "history": (f"per size N: N keys (the same memories as above) written as base rows, then "
                    f"revision rounds ({P_REVISED:.0%} of keys get 1-3 new values from messages never "
                    f"stored or queried, each valid from a later date, {P_CORRECTION:.0%} of them "
                    f"corrections without valid_from), merge rows retiring {P_RETIRED:.0%} of keys with "
                    f"valid_to, and rows of other keys superseding {P_TOMBSTONED:.0%} of keys "
                    f"(tombstones); {P_VALID_FROM:.0%} of base rows have valid_from; world times in "
                    f"{WORLD_SPAN_DAYS} days from {iso_utc(WORLD_T0)}; {ROWS_PER_ENTRY} rows (+ vectors) "
                    "per signed entry, every later row with its supersedes edge as remember writes it"),
        "path": "RecallArgs.model_validate(args).filters(now) (the recall tool's parsing), the query "
                "embedded by the hashed embedder when it has words, MemoryView.recall(limit=10, filters=...)",
        "cases": {
            "now_hybrid": "no time argument, the same history bank (the clock after the whole history)",
            "as_of_hybrid / as_of_bm25": "as_of a world time uniform over the span, with / without the vector",
            "as_of_newest": "as_of with no query (newest first among what held then)",
            "as_known_at_hybrid": "as_known_at an entry drawn uniformly from the bank's entries, one per query",
            "as_known_at_anchor_hybrid": "as_known_at one entry (the middle one) for every query",
            "as_known_at_newest": "as_known_at with no query",
            "as_known_at_and_as_of_hybrid": "both",
            "as_of_first_s": "the first as_of recall after the view was built (the timeline arrays "
                             "of rows fed one by one are ordered then)",
            "as_of_after_write": f"{AFTER_WRITE_SAMPLES} x (one remember, then one as_of recall)",
            "as_known_at_after_write": f"{AFTER_WRITE_SAMPLES} x (a remember E, another remember, then one "
                                       "as_known_at E recall)",
            "rss": "MiB of VmRSS (after gc.collect() and malloc_trim): after minus before building the "
                   "history database with its view (fed row by row), and a second view of it built by "
                   "rebuild (what opening a node pays)",
        },
        "sizes": {},
    }
    with tempfile.TemporaryDirectory(prefix="memmesh-recall-time-") as tmp_name:
        for n in sizes:
            label = SIZES[n]
            # Freed heap is handed back first (malloc_trim): otherwise what earlier steps freed
            # and the allocator kept hides what the step under measurement holds.
            rss = {"before_mb": trimmed_rss_mib()}
            built = build_history(Path(tmp_name), mems, revision_values, n, hashed, args.seed + 11)
            rss["after_mb"] = trimmed_rss_mib()
            rss["delta_mb"] = rss["after_mb"] - rss["before_mb"]
            t = time.perf_counter()
            second = MemoryView(built["db"], embedding_store=hashed.store_name, dim=hashed.dim)
            rss["view_rebuild_s"] = time.perf_counter() - t
            rss["second_view_mb"] = trimmed_rss_mib() - rss["after_mb"]
            second.close()
            del second
            gc.collect()
            log(f"built history {label}: {built['stats']['rows']} rows in {built['stats']['entries']} entries, "
                f"{built['stats']['build_s']:.1f}s; RSS +{rss['delta_mb']:.0f} MiB, a rebuilt view "
                f"+{rss['second_view_mb']:.0f} MiB in {rss['view_rebuild_s']:.1f}s")
            report["time_aware"]["sizes"][label] = bench_time(n, built, queries[:args.time_queries], hashed,
                                                              args.seed + 13)
            report["time_aware"]["sizes"][label]["rss"] = rss
            report["time_aware"]["sizes"][label]["neighbors"] = bench_neighbors(
                Path(tmp_name) / f"nb-{label}", mems, n, args.seed + 17)
            log(f"measured neighbors {label}")
            built["view"].close()
            built["storage"].close()
            del built
            gc.unfreeze()
            gc.collect()
            log(f"measured time-aware {label}")

    # Flat keys of the issue.
    flat: dict = {}
    for label, r in report["time_aware"]["sizes"].items():
        for case in TIME_CASES:
            if "p99_ms" in r.get(case, {}):
                flat[f"recall_p50_ms_{case}_{label}"] = r[case]["p50_ms"]
                flat[f"recall_p99_ms_{case}_{label}"] = r[case]["p99_ms"]
    for label, r in ((SIZES[n], report["sizes"][SIZES[n]]) for n in sizes if not args.time_only):
        flat[f"recall_p50_ms_bm25_{label}"] = r["recall_bm25"]["p50_ms"]
        flat[f"recall_p99_ms_bm25_{label}"] = r["recall_bm25"]["p99_ms"]
        flat[f"recall_p50_ms_hybrid_{label}"] = r["recall_hybrid"]["p50_ms"]
        flat[f"recall_p99_ms_hybrid_{label}"] = r["recall_hybrid"]["p99_ms"]
        flat[f"top10_identical_frac_{label}"] = r["top10_identical"]
        flat[f"top10_tie_aware_frac_{label}"] = r["top10_tie_aware"]
        flat[f"bm25s_speed_ratio_{label}"] = r["bm25s_speed_ratio"]
        flat[f"db_open_s_{label}"] = r["open"]["db_open_s"]
        flat[f"view_build_s_{label}"] = r["open"]["view_build_s"]
    if not args.time_only:
        flat["remember_per_s"] = report["remember"]["per_s"]
        flat["embed_texts_per_s_default"] = (report["embed_default"] or report["embed_hashed"])["texts_per_s"]
        flat["embed_default_provider"] = (report["embed_default"] or report["embed_hashed"])["provider"]
        flat["embed_texts_per_s_hashed"] = report["embed_hashed"]["texts_per_s"]
        rss = report["sizes"][SIZES[n_max]]["rss"]
        flat["rss_mb_per_100k"] = rss["delta_mb"] * 100_000 / n_max
        rss["measured_at_memories"] = n_max
        rss["scaled"] = (f"--quick: measured at {n_max:,} memories and scaled x{100_000 // n_max} to 100k"
                         if n_max != 100_000 else "measured at 100k, not scaled")
        rss["note"] = ("MiB of VmRSS (/proc/self/status), after minus before creating the storage, Database "
                       "and MemoryView and writing every memory (incl. the hashed embedder's feature cache); "
                       "second_view_mb: VmRSS growth when one more MemoryView is built over the same database "
                       "by rebuild (view_rebuild_s, as on the first recall after opening a node); it includes "
                       "rebuild garbage the allocator keeps, so it over-states a view alone")
    report = {**flat, **report}

    at = SIZES[n_max]
    report["targets"] = {"evaluated_at": at if n_max == 100_000 else f"{at} (--quick has no 100k run)"}
    for case in TIME_TARGET_CASES:
        value = flat.get(f"recall_p99_ms_{case}_{at}")
        if value is not None:
            report["targets"][f"recall_p99_ms_{case}_100k"] = {"max": TARGET_TIME_P99_MS, "value": value,
                                                             "met": value <= TARGET_TIME_P99_MS}
    if not args.time_only:
        report["targets"] |= {
            "recall_p99_ms_hybrid_100k": {"max": TARGET_HYBRID_P99_MS, "value": flat[f"recall_p99_ms_hybrid_{at}"],
                                          "met": flat[f"recall_p99_ms_hybrid_{at}"] <= TARGET_HYBRID_P99_MS},
            "top10_identical_frac_100k": {"min": TARGET_TOP10_IDENTICAL, "value": flat[f"top10_identical_frac_{at}"],
                                          "met": flat[f"top10_identical_frac_{at}"] >= TARGET_TOP10_IDENTICAL},
            "top10_tie_aware_frac_100k": {"min": TARGET_TOP10_IDENTICAL, "value": flat[f"top10_tie_aware_frac_{at}"],
                                          "met": flat[f"top10_tie_aware_frac_{at}"] >= TARGET_TOP10_IDENTICAL,
                                          "note": "the same target, ties of bitwise-equal scores in any order"},
        }

    print_table(report, sizes)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def print_table(report: dict, sizes: list[int]) -> None:
    m = report["machine"]
    print(f"memmesh recall benchmark (full stack)  {report['date']}  {m['cpu']}  nproc={m['nproc']}  "
          f"python {report['python']}  OPENBLAS_NUM_THREADS={report['openblas_num_threads']}"
          + ("  --quick" if report["quick"] else ""))
    lines = print_plain(report, sizes) if report["sizes"] else []
    print_time(report["time_aware"]["sizes"])
    at = report["targets"]["evaluated_at"]
    for name, t in report["targets"].items():
        if isinstance(t, dict):
            bound = f"<= {t['max']:g}" if "max" in t else f">= {t['min']:g}"
            lines.append((f"target {name}", f"{t['value']:.4g}", f"{bound} at {at}: {'MET' if t['met'] else 'MISSED'}"))
    w = max((len(a) for a, _, _ in lines), default=0)
    print()
    for name, value, detail in lines:
        print(f"{name:{w}}  {value:>8}   {detail}")


def _pp(d: dict) -> str:
    return f"{d['p50_ms']:.2f} / {d['p99_ms']:.2f}" if "p50_ms" in d else "error"


def print_time(by_size: dict[str, dict]) -> None:
    """The time-aware table: one column per size of the history bank."""
    if not by_size:
        return
    b = lambda r: r["build"]  # noqa: E731
    rows = [
        ("history: keys / rows / entries", lambda r: f"{r['n_keys']:,} / {b(r)['rows']:,} / {b(r)['entries']}"),
        ("  revisions / retired / tombstoned",
         lambda r: f"{b(r)['revisions']:,} / {b(r)['retired']:,} / {b(r)['tombstoned']:,}"),
        ("  build s", lambda r: f"{b(r)['build_s']:.1f}"),
        ("keys held at an as_of time (mean)", lambda r: f"{r['keys_held_at_mean']:,.0f}"),
    ]
    rows += [(f"{case} p50 / p99 ms", (lambda c: lambda r: _pp(r[c]) if c in r else "n/a")(case))
             for case in TIME_CASES]
    rows += [
        ("as_of first recall s", lambda r: f"{r['as_of_first_s']:.3f}"),
        ("as_of after a write p50 / max ms",
         lambda r: f"{r['as_of_after_write']['p50_ms']:.1f} / {r['as_of_after_write']['max_ms']:.1f}"),
        ("as_known_at after a write p50 / max ms",
         lambda r: f"{r['as_known_at_after_write']['p50_ms']:.1f} / {r['as_known_at_after_write']['max_ms']:.1f}"),
        ("RSS MiB: bank + view / rebuilt view", lambda r: f"{r['rss']['delta_mb']:.0f} / {r['rss']['second_view_mb']:.0f}"),
        ("view rebuild s", lambda r: f"{r['rss']['view_rebuild_s']:.2f}"),
        ("neighbors depth 1 p50 / p99 ms", lambda r: _pp(r["neighbors"]["depth_1"])),
        ("neighbors depth 2 p50 / p99 ms", lambda r: _pp(r["neighbors"]["depth_2"])),
        ("  mean neighbours at depth 1 / 2", lambda r: f"{r['neighbors']['depth_1']['mean_neighbors']:.1f} / "
                                                   f"{r['neighbors']['depth_2']['mean_neighbors']:.1f}"),
        ("view arrays MiB (bm25/vec/old vec/cols)", lambda r: "/".join(
            f"{r['view_sizes'][k] / 2**20:.0f}" for k in ("bm25_bytes", "vectors_bytes", "old_vectors_bytes",
                                                          "columns_bytes"))),
    ]
    cols = list(by_size)
    w = max(len(name) for name, _ in rows)
    cw = 26
    print()
    print("time-aware recall (a bank with a history)")
    print(f"{'':{w}}  " + "".join(f"{'N=' + c:>{cw}}" for c in cols))
    for name, fmt in rows:
        print(f"{name:{w}}  " + "".join(f"{fmt(by_size[c]):>{cw}}" for c in cols))
    for c in cols:
        if "as_known_at" in by_size[c]:
            print(f"N={c}: {by_size[c]['as_known_at']}")


def print_plain(report: dict, sizes: list[int]) -> list[tuple[str, str, str]]:
    """The plain recall table; returns the single-figure lines printed after it."""
    pp = _pp
    rows = [
        ("build: entries / s / memories per s",
         lambda r: f"{r['build']['entries']} / {r['build']['build_s']:.1f} / {r['build']['memories_per_s']:,.0f}"),
        ("recall BM25 p50 / p99 ms", lambda r: pp(r["recall_bm25"])),
        ("recall hybrid p50 / p99 ms", lambda r: pp(r["recall_hybrid"])),
        ("  of which query embed p50 / p99 ms", lambda r: pp(r["query_embed_hashed"])),
        ("bm25s retrieve k=10 p50 / p99 ms", lambda r: pp(r["bm25s_retrieve10"])),
        ("speed ratio bm25s / ours (p50)", lambda r: f"{r['bm25s_speed_ratio']:.2f}x"),
        ("top-10 identical / same set", lambda r: f"{100 * r['top10_identical']:.1f}% / {100 * r['top10_same_set']:.1f}%"),
        ("top-10 tie-aware exact / f32", lambda r: f"{100 * r['top10_tie_aware']:.1f}% / {100 * r['top10_tie_aware_f32']:.1f}%"),
        ("max rel score diff vs bm25s", lambda r: f"{r['max_rel_score_diff']:.1e}"),
        ("full gc.collect() ms: node / total", lambda r: f"{r['full_gc_ms_node']:.0f} / {r['full_gc_ms']:.0f}"),
        ("open: Database.open / view build s",
         lambda r: f"{r['open']['db_open_s']:.2f} / {r['open']['view_build_s']:.2f}"),
    ]
    cols = [SIZES[n] for n in sizes]
    w = max(len(name) for name, _ in rows)
    cw = 22
    print(f"{'':{w}}  " + "".join(f"{'N=' + c:>{cw}}" for c in cols))
    for name, fmt in rows:
        print(f"{name:{w}}  " + "".join(f"{fmt(report['sizes'][c]):>{cw}}" for c in cols))
    top = SIZES[max(sizes)]
    rem = report["remember"]
    rss = report["sizes"][top]["rss"]
    ed, eh = report["embed_default"] or report["embed_hashed"], report["embed_hashed"]
    lat = lambda d: f"p50 {d['p50_ms']:.2f} ms, p99 {d['p99_ms']:.2f} ms, n={d['n']}"  # noqa: E731
    lines = [("remember_per_s", f"{rem['per_s']:,.0f}", f"1 memory + vector per entry, fresh db; {lat(rem)}")]
    late = report["sizes"][top].get("remember_into_this_db")
    if late:
        lines.append((f"  into the {top} db", f"{late['per_s']:,.0f}", lat(late)))
    one = f"; {ed['texts_per_s_one_call']:,.0f}/s in one call" if "texts_per_s_one_call" in ed else ""
    lines += [
        ("embed_texts_per_s_default", f"{ed['texts_per_s']:,.0f}",
         f"{ed['provider']}/{ed['model']}, calls of {ed['batch']} texts{one}; first call {ed['first_call_s']:.2f} s"),
        ("embed_texts_per_s_hashed", f"{eh['texts_per_s']:,.0f}", f"calls of {eh['batch']} texts"),
        ("rss_mb_per_100k", f"{report['rss_mb_per_100k']:,.0f}",
         f"{rss['delta_mb']:.0f} MiB at {rss['measured_at_memories']:,} memories"
         + (f", scaled x{100_000 // rss['measured_at_memories']}" if rss["measured_at_memories"] != 100_000 else "")
         + f"; a 2nd view by rebuild: +{rss['second_view_mb']:.0f} MiB in {rss['view_rebuild_s']:.1f} s"),
    ]
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
