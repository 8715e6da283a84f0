"""The quantised first pass of VectorIndex at scale: agreement with the exact ranking, latency, memory.

Usage::

    python bench/scale_vectors.py [--sizes 100000,1000000] [--queries N] [--seed S] [--json PATH] [--cache DIR]
                                  [--local N [--sweep]]

``measure(n, queries, seed)`` is the whole measurement for one bank size (bench/scale.py calls it).
``measure_local(n, queries, seed)`` is the quality check on dense vectors (below).

Corpus: the Chit-Chat messages as bench/recall.py uses them (bench/_common.load_messages: a
seeded shuffle; the last HELD_OUT messages are never stored, queries come from them, 2-6 tokens
joined by spaces, bench/_common.make_queries). Memory i stores message ``i mod M`` (M = the
messages not held out, about 128k) under the key ``<its first three words>-n<i>`` with 1-2 tags
(bench/recall.make_memories' recipe), and its vector is the hashed embedding of
``key + " " + value``. Above M rows the messages repeat; the copies differ by their keys only
(the ``n<i>`` token and its character n-grams are unique per memory), which gives every query
clusters of near-equal cosines: a hard case for a first pass.

Two indexes share the same float32 rows (:meth:`VectorIndex.units` / :meth:`from_units`, no
copy): ``exact`` (quantised pass disabled) and ``quantised`` (threshold 0). A
:class:`RecallIndex` of the n memories (BM25 over key, value and tags) is ranked with each in
turn as its vector block. Measured per size, ``queries`` queries:

* ``cosine_top10_agreement`` / ``cosine_top100_agreement``: share of queries whose cosine top-10 /
  top-100 (``VectorIndex.search``, ties by T order as recall breaks them) has the same ids as
  the exact one (100 is the depth recall fuses at); ``cosine_top10_identical``: same list.
* ``hybrid_top10_agreement`` / ``hybrid_top10_identical``: the same for ``RecallIndex.rank``
  (BM25 + cosine, RRF), limit 10.
* ``search_p50_ms`` / ``search_p99_ms`` (quantised, limit 100 as recall asks) and the exact
  path's; ``hybrid_p50_ms`` / ``hybrid_p99_ms`` (``RecallIndex.rank``, query embedding excluded).
* ``codes_mib`` (the int8 codes), ``rows_mib`` (the float32 rows), ``rss_index_mib`` (VmRSS
  growth while building the quantised index over the rows, i.e. its codes and bookkeeping), and
  ``rss_total_mib`` (VmRSS at the end: rows, codes, the RecallIndex, the corpus).

From ``--no-hybrid-from`` rows up (default 500,000) the RecallIndex is not built (with its corpus
it took about 1 GiB at 500k memories: with the rows and codes, over 4 GiB at a million) and
the hybrid latencies are None; ``cosine_top100_identical`` then bounds the hybrid agreement from
below and is reported as it (see :func:`measure`).

Local model check (``--local N``, :func:`measure_local`): the same memories and queries embedded by
the local MiniLM model (the ``embed`` extra; skipped, with the reason, when it is not installed).
Its vectors are dense (every coordinate non-zero), the case the hashed embedder never exercises:
the first pass reads every code, and its rounding errors touch every term of a score. Same
figures, measured against the exact path: cosine and fused
top-10 agreement (share of queries with the same ids), mean top-10 overlap, search and hybrid
latency. ``--sweep``: while an agreement is below 0.99, the pass again with ``candidate_min``
doubled (the :class:`VectorIndex` constructor's argument). Embedding 100k memories takes tens of
minutes on two cores, so the vectors are cached as .npy (``--cache``, else a directory in the
system's temporary directory) under the model, the count and a CRC-32 of the texts.

``OPENBLAS_NUM_THREADS=1`` as in bench/recall.py; 20 warm-up queries and a frozen GC before
each timed loop (bench/_common.timed).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import zlib  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from _common import HELD_OUT, load_messages, machine, make_queries, timed  # noqa: E402

from memmesh.node.memory.embedders import HashedEmbedder  # noqa: E402
from memmesh.node.memory.recall_index import RRF_DEPTH, RecallIndex  # noqa: E402
from memmesh.node.memory.rows import Memory, order_desc_key  # noqa: E402
from memmesh.node.memory.tokens import tokenize  # noqa: E402
from memmesh.node.memory.vectors import CANDIDATE_FACTOR, CANDIDATE_MIN, QUANTISE_FROM, VectorIndex  # noqa: E402

TAGS = ("chat", "personal", "work", "ideas", "todo", "family")  # as bench/recall.py
KEY_WORDS = 3
NO_HYBRID_FROM = 500_000  # sizes from here up skip the RecallIndex (memory; see measure)
LOCAL_CHUNK = 1024  # texts per call of the local embedder (it batches them by 32)


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class _Texts:
    """``key + " " + value`` of memory i, embedded a slice at a time (add_many stacks chunks)."""

    def __init__(self, texts: list[str], hashed: HashedEmbedder) -> None:
        self.texts, self.hashed = texts, hashed

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, s: slice) -> np.ndarray:
        return self.hashed.embed(self.texts[s])


def _order(i: int) -> tuple[int, str, int]:
    return (i, f"sha256:{i:064x}", 0)


def _memories(pool: list[str], n: int, seed: int) -> list[Memory]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        msg = pool[i % len(pool)]
        words = [w[:24] for w in tokenize(msg)[:KEY_WORDS]] or ["note"]
        key = "-".join(words) + f"-n{i:06d}"
        out.append(Memory(key=key, value=msg, tags=tuple(rnd.sample(TAGS, rnd.randint(1, 2))), ts=0,
                          author="bench", entry_id=_order(i)[1], row_key=f"{i}/0", order=_order(i)))
    return out


def _exact_index(mems: list[Memory], hashed: HashedEmbedder, cache: Path | None, seed: int) -> VectorIndex:
    texts = [f"{m.key} {m.value}" for m in mems]
    n = len(mems)
    path = None if cache is None else cache / f"scale_vectors_units_{n}_{seed}.npy"
    if path is not None and path.exists():
        units = np.load(path)
        return VectorIndex.from_units(hashed.dim, range(n), units, quantise_from=None)
    index = VectorIndex(hashed.dim, quantise_from=None)
    index.add_many(range(n), _Texts(texts, hashed))  # type: ignore[arg-type]
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, index.units()[1])
    return index


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] scale_vectors: {msg}", file=sys.stderr, flush=True)


def local_cache_dir(cache: Path | None) -> Path:
    """Where the local model's vectors are kept between runs: ``cache``, else a directory in the
    system's temporary directory (the embedding is the slow part: about 50 texts/s per core)."""
    return cache if cache is not None else Path(tempfile.gettempdir()) / "memmesh-bench-local-vectors"


def local_vectors(embedder: Any, texts: list[str], what: str, cache: Path) -> np.ndarray:
    """The local embedder's unit float32 rows of ``texts``, from ``cache`` when an earlier run made
    them (the file is named by the model, the count and a CRC-32 of the texts, so another corpus,
    seed or size never reuses it). Texts are embedded a chunk at a time in order of length (less
    padding per batch), with progress on stderr."""
    crc = zlib.crc32("\n".join(texts).encode("utf-8", "surrogatepass"))
    path = cache / f"local_{embedder.model}_{what}_{len(texts)}_{crc:08x}.npy"
    if path.exists():
        rows = np.load(path)
        if rows.shape == (len(texts), embedder.dim) and rows.dtype == np.float32:
            log(f"{what}: {len(texts):,} local vectors from {path}")
            return rows
    embedder.load()
    order = sorted(range(len(texts)), key=lambda i: (len(texts[i]), i))
    rows = np.empty((len(texts), embedder.dim), dtype=np.float32)
    t0 = last = time.perf_counter()
    for a in range(0, len(order), LOCAL_CHUNK):
        idx = order[a : a + LOCAL_CHUNK]
        rows[idx] = embedder.embed([texts[i] for i in idx])
        now = time.perf_counter()
        done = a + len(idx)
        if now - last > 10 or done == len(order):
            rate = done / (now - t0)
            log(f"{what}: embedded {done:,}/{len(texts):,} ({rate:.0f} texts/s, "
                f"{(len(texts) - done) / rate:.0f} s left; the longest texts come last)")
            last = now
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, rows)
    tmp.replace(path)  # a run killed while saving leaves no truncated cache behind
    return rows


def measure(n: int, queries: int, seed: int, *, cache: Path | None = None, hybrid: bool | None = None) -> dict:
    """Every figure of the module docstring for a bank of ``n`` memories and ``queries`` queries.

    ``hybrid``: None (default) means ``n < NO_HYBRID_FROM``. ``hybrid=False``: no RecallIndex (about 2 KiB per memory with its corpus, too much for a
    small machine at a million); the hybrid figures are then None. The fused top 10 depends on
    the cosine list only through its ids in order (RRF) and their exact scores (the relevance
    floor), so it is identical whenever ``cosine_top100_identical`` holds: that share is a lower
    bound of the hybrid agreement, reported as ``hybrid_top10_agreement`` with
    ``hybrid_top10_agreement_is_bound`` true.
    """
    if hybrid is None:
        hybrid = n < NO_HYBRID_FROM
    t0 = time.perf_counter()
    msgs = load_messages(seed)
    pool, held = msgs[:-HELD_OUT], msgs[-HELD_OUT:]
    qtoks = make_queries([tokenize(m) for m in held], queries, random.Random(seed + 1))
    hashed = HashedEmbedder()
    mems = _memories(pool, n, seed + 7)
    del msgs
    exact = _exact_index(mems, hashed, cache, seed)
    embed_s = time.perf_counter() - t0

    ids, units = exact.units()
    rss0 = rss_mib()
    t1 = time.perf_counter()
    quant = VectorIndex.from_units(hashed.dim, ids, units, quantise_from=0)
    codes_build_s = time.perf_counter() - t1
    rss_index = rss_mib() - rss0

    ri = RecallIndex()
    if hybrid:
        ri.add_many(mems, list(range(n)))
        ri.make_current_many(range(n))
        tiebreak = ri.tiebreak.__getitem__
    else:
        del mems

        def tiebreak(d: int) -> tuple[int, int, int]:
            return order_desc_key(_order(d))
    qvecs = [hashed.embed([" ".join(q)])[0] for q in qtoks]

    def search(index: VectorIndex, v: np.ndarray, limit: int) -> list[tuple[int, float]]:
        return index.search(v, limit=limit, tiebreak=tiebreak)

    def fused(index: VectorIndex, toks: list[str], v: np.ndarray) -> list[int]:
        ri.vectors[hashed.dim] = index
        return [m.entry_id for m, _ in ri.rank(toks, frozenset(), 10, v, False, None)]

    q_res, q_lat = timed(lambda v: search(quant, v, RRF_DEPTH), [(v,) for v in qvecs])
    e_res, e_lat = timed(lambda v: search(exact, v, RRF_DEPTH), [(v,) for v in qvecs])
    if hybrid:
        qh_res, qh_lat = timed(lambda t, v: fused(quant, t, v), list(zip(qtoks, qvecs)))
        eh_res, eh_lat = timed(lambda t, v: fused(exact, t, v), list(zip(qtoks, qvecs)))

    def share(pairs: list[tuple[list, list]]) -> float:
        return sum(a == b for a, b in pairs) / max(1, len(pairs))

    ids10 = [([d for d, _ in a[:10]], [d for d, _ in b[:10]]) for a, b in zip(q_res, e_res)]
    ids100 = [([d for d, _ in a], [d for d, _ in b]) for a, b in zip(q_res, e_res)]
    return {
        "n": n,
        "queries": len(qvecs),
        "seed": seed,
        "dim": hashed.dim,
        "corpus_messages": len(pool),
        "quantise_from_default": QUANTISE_FROM,
        "candidates": f"max({CANDIDATE_FACTOR} * limit, {CANDIDATE_MIN})",
        "cosine_top10_agreement": share([(set(a), set(b)) for a, b in ids10]),
        "cosine_top10_identical": share(ids10),
        "cosine_top100_agreement": share([(set(a), set(b)) for a, b in ids100]),
        "cosine_top100_identical": share(ids100),
        "hybrid_top10_agreement": (share([(set(a), set(b)) for a, b in zip(qh_res, eh_res)]) if hybrid
                                   else share(ids100)),
        "hybrid_top10_agreement_is_bound": not hybrid,
        "hybrid_top10_identical": share(list(zip(qh_res, eh_res))) if hybrid else None,
        "search_p50_ms": q_lat["p50_ms"],
        "search_p99_ms": q_lat["p99_ms"],
        "exact_search_p50_ms": e_lat["p50_ms"],
        "exact_search_p99_ms": e_lat["p99_ms"],
        "hybrid_p50_ms": qh_lat["p50_ms"] if hybrid else None,
        "hybrid_p99_ms": qh_lat["p99_ms"] if hybrid else None,
        "exact_hybrid_p50_ms": eh_lat["p50_ms"] if hybrid else None,
        "exact_hybrid_p99_ms": eh_lat["p99_ms"] if hybrid else None,
        "codes_mib": (quant._codes.nbytes if quant._codes is not None else 0) / 2**20,
        "rows_mib": units.nbytes / 2**20,
        "rss_index_mib": rss_index,
        "rss_total_mib": rss_mib(),
        "codes_build_s": codes_build_s,
        "embed_s": embed_s,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }


def measure_local(n: int, queries: int, seed: int, *, cache: Path | None = None, sweep: bool = False,
                  min_agreement: float = 0.99) -> dict:
    """The quality check on dense vectors: :func:`measure`'s corpus and queries embedded by the local
    model (MiniLM, every coordinate non-zero, so the first pass reads every code), the quantised
    pass at its default depth against the exact path, cosine and fused (``RecallIndex.rank``).

    The rows go in as a view puts them (``add_many``, normalised again); the quantised index shares
    them (threshold 0). ``sweep``: when an agreement is below ``min_agreement``, the pass again with
    a deeper cut (``candidate_min`` x2 each time, through the :class:`VectorIndex` constructor)
    until both reach it or the cut takes every row. ``{"skipped": why}`` when the local model is
    not installed. The vectors are cached (:func:`local_vectors`; ``cache`` None: a temporary
    directory kept between runs).
    """
    from memmesh.node.memory.embedders import EmbedderError, LocalOnnxEmbedder, local_model_problem

    problem = local_model_problem()
    if problem is not None:
        return {"skipped": problem}
    try:
        embedder = LocalOnnxEmbedder()
    except EmbedderError as exc:
        return {"skipped": str(exc)}
    msgs = load_messages(seed)
    pool, held = msgs[:-HELD_OUT], msgs[-HELD_OUT:]
    qtoks = make_queries([tokenize(m) for m in held], queries, random.Random(seed + 1))
    mems = _memories(pool, n, seed + 7)
    del msgs
    where = local_cache_dir(cache)
    t0 = time.perf_counter()
    qrows = local_vectors(embedder, [" ".join(q) for q in qtoks], "queries", where)
    rows = local_vectors(embedder, [f"{m.key} {m.value}" for m in mems], "memories", where)
    embed_s = time.perf_counter() - t0
    dim = embedder.dim

    exact = VectorIndex(dim, quantise_from=None)
    exact.add_many(range(n), rows)
    del rows
    ids, units = exact.units()
    ri = RecallIndex()
    ri.add_many(mems, list(range(n)))
    ri.make_current_many(range(n))
    del mems
    tiebreak = ri.tiebreak.__getitem__
    qvecs = list(qrows)

    def search(index: VectorIndex, v: np.ndarray) -> list[int]:
        return [d for d, _ in index.search(v, limit=RRF_DEPTH, tiebreak=tiebreak)]

    def fused(index: VectorIndex, toks: list[str], v: np.ndarray) -> list[int]:
        ri.vectors[dim] = index
        return [m.entry_id for m, _ in ri.rank(toks, frozenset(), 10, v, False, None)]

    log(f"local {n:,}: exact path, {len(qvecs)} queries")
    e_res, e_lat = timed(lambda v: search(exact, v), [(v,) for v in qvecs])
    eh_res, eh_lat = timed(lambda t, v: fused(exact, t, v), list(zip(qtoks, qvecs)))

    def share(pairs: list[tuple[list, list]]) -> float:
        return sum(set(a) == set(b) for a, b in pairs) / max(1, len(pairs))

    def overlap(pairs: list[tuple[list, list]]) -> float:
        return sum(len(set(a) & set(b)) / max(1, len(b)) for a, b in pairs) / max(1, len(pairs))

    def at_depth(candidate_min: int) -> dict:
        quant = VectorIndex.from_units(dim, ids, units, quantise_from=0, candidate_factor=CANDIDATE_FACTOR,
                                       candidate_min=candidate_min)
        log(f"local {n:,}: quantised pass, candidates max({CANDIDATE_FACTOR} x {RRF_DEPTH}, {candidate_min})")
        q_res, q_lat = timed(lambda v: search(quant, v), [(v,) for v in qvecs])
        qh_res, qh_lat = timed(lambda t, v: fused(quant, t, v), list(zip(qtoks, qvecs)))
        top10 = [(a[:10], b[:10]) for a, b in zip(q_res, e_res)]
        return {
            "candidate_min": candidate_min,
            "candidates": max(CANDIDATE_FACTOR * RRF_DEPTH, candidate_min),
            "cosine_top10_agreement": share(top10),
            "cosine_top10_identical": sum(a == b for a, b in top10) / max(1, len(top10)),
            "cosine_top10_overlap": overlap(top10),
            "cosine_top100_agreement": share(list(zip(q_res, e_res))),
            "cosine_top100_overlap": overlap(list(zip(q_res, e_res))),
            "hybrid_top10_agreement": share(list(zip(qh_res, eh_res))),
            "hybrid_top10_identical": sum(a == b for a, b in zip(qh_res, eh_res)) / max(1, len(qh_res)),
            "hybrid_top10_overlap": overlap(list(zip(qh_res, eh_res))),
            "search_p50_ms": q_lat["p50_ms"], "search_p99_ms": q_lat["p99_ms"],
            "hybrid_p50_ms": qh_lat["p50_ms"], "hybrid_p99_ms": qh_lat["p99_ms"],
        }

    runs = [at_depth(CANDIDATE_MIN)]
    depth = CANDIDATE_MIN
    while sweep and depth < n and min(runs[-1]["cosine_top10_agreement"],
                                      runs[-1]["hybrid_top10_agreement"]) < min_agreement:
        depth *= 2
        runs.append(at_depth(depth))
    first = runs[0]
    reached = [r["candidate_min"] for r in runs
               if min(r["cosine_top10_agreement"], r["hybrid_top10_agreement"]) >= min_agreement]
    return {
        "n": n, "queries": len(qvecs), "seed": seed, "model": embedder.model, "dim": dim,
        "query_nonzero_share": float(np.count_nonzero(qrows) / qrows.size),
        "candidates_default": f"max({CANDIDATE_FACTOR} * limit, {CANDIDATE_MIN})",
        **{k: v for k, v in first.items() if k not in ("candidate_min", "candidates")},
        "exact_search_p50_ms": e_lat["p50_ms"], "exact_search_p99_ms": e_lat["p99_ms"],
        "exact_hybrid_p50_ms": eh_lat["p50_ms"], "exact_hybrid_p99_ms": eh_lat["p99_ms"],
        "depths": runs,
        "candidate_min_reaching": reached[0] if reached else None,
        "min_agreement": min_agreement,
        "embed_s": embed_s,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }


def local_headline(r: dict) -> dict[str, float]:
    """The flat figures bench/scale.py writes for :func:`measure_local` (suffix ``_local_<size>``
    added there): fused and cosine top-10 agreement, search latency quantised and exact."""
    return {"top10_agreement_vs_exact": r["hybrid_top10_agreement"],
            "top10_cosine_agreement": r["cosine_top10_agreement"],
            "vector_search_ms_p50": r["search_p50_ms"], "vector_search_ms_p99": r["search_p99_ms"],
            "exact_vector_search_ms_p50": r["exact_search_p50_ms"],
            "exact_vector_search_ms_p99": r["exact_search_p99_ms"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100000,1000000", help="comma-separated bank sizes")
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--json", type=Path, help="write all figures to this file")
    ap.add_argument("--no-hybrid-from", type=int, default=NO_HYBRID_FROM,
                    help="sizes from this one up skip the RecallIndex (memory), cosine figures only")
    ap.add_argument("--cache", type=Path, help="keep the embedded rows here (.npy) for the next run")
    ap.add_argument("--local", type=int, metavar="N",
                    help="also the local model's quality check at N memories (measure_local)")
    ap.add_argument("--sweep", action="store_true",
                    help="with --local: deepen the cut until top-10 agreement reaches 0.99")
    args = ap.parse_args(argv)
    rows = [measure(int(s), args.queries, args.seed, cache=args.cache, hybrid=int(s) < args.no_hybrid_from)
            for s in args.sizes.split(",") if s.strip()]
    local = None
    if args.local:
        local = measure_local(args.local, args.queries, args.seed, cache=args.cache, sweep=args.sweep)
        if "skipped" in local:
            print(f"local model check skipped: {local['skipped']}")
        else:
            print(f"local model ({local['model']}), {local['n']:,} memories, {local['queries']} queries")
            cols_l = ["candidate_min", "cosine_top10_agreement", "cosine_top10_overlap", "hybrid_top10_agreement",
                      "hybrid_top10_overlap", "search_p50_ms", "search_p99_ms", "hybrid_p99_ms"]
            print(" ".join(f"{c:>22}" for c in cols_l))
            for r in local["depths"]:
                print(" ".join(f"{r[c]:>22.4g}" if isinstance(r[c], float) else f"{r[c]!s:>22}" for c in cols_l))
            print(f"exact path: search p50 / p99 {local['exact_search_p50_ms']:.2f} / "
                  f"{local['exact_search_p99_ms']:.2f} ms, hybrid p99 {local['exact_hybrid_p99_ms']:.2f} ms")
    cols = ["n", "cosine_top10_agreement", "cosine_top100_agreement", "cosine_top100_identical",
            "hybrid_top10_agreement", "search_p50_ms", "search_p99_ms", "exact_search_p50_ms", "hybrid_p99_ms",
            "codes_mib", "rss_index_mib", "rss_total_mib"]
    if rows:
        print(" ".join(f"{c:>22}" for c in cols))
    for r in rows:
        print(" ".join(f"{r[c]:>22.4g}" if isinstance(r[c], float) else f"{r[c]!s:>22}" for c in cols))
    if args.json:
        args.json.write_text(json.dumps({"bench": "scale_vectors", "machine": machine(), "results": rows,
                                         "local": local}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
