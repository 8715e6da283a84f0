"""Microbenchmark of the pure ranking core (node.memory): BM25, vectors, RRF.

Usage::

    python bench/recall_core.py [--quick] [--json PATH] [--queries N] [--seed S]

Bench-only dependencies (not in the test extras): ``pip install bm25s chitchat-dataset``.

What it does, for each corpus size N (1k, 10k, 100k; ``--quick``: 1k and 10k):

* Corpus: the first N messages of the Chit-Chat dataset (package ``chitchat-dataset``,
  MIT, ships its data) after a seeded shuffle; queries come from the last 10,000
  shuffled messages, which are never indexed. Each query is 2-6 tokens (uniform)
  sampled without replacement from the token list of one held-out message with at least
  2 tokens. Tokenisation is :func:`node.memory.tokens.tokenize` for everything.
* Latency (p50/p99 over all queries, after a warm-up): ``InvertedIndex.search`` with
  limit 10, 100 and None; ``VectorIndex.search`` (random float32 vectors, dim 384, a
  random query vector per query) with limit 10 and 100; ``rrf`` of the two 100-deep
  lists to 10; and "hybrid" = BM25(100) + vectors(100) + RRF(10) in sequence, also
  with Python ``allowed``/``tiebreak`` callables as recall passes them.
* Agreement with bm25s (``method="lucene", k1=1.5, b=0.75``), fed the *same* token ids
  (the corpus as ``(ids, vocab)``, each query as its list of known token ids, duplicates
  kept), ``retrieve(k=10)``; bm25s results with score 0 (no matching token) are dropped.
  Per query:

  - ``strict``: the two ranked id lists are identical;
  - ``tie-aware``: position by position, our exact float64 score of bm25s's document
    equals our score at that rank, i.e. the lists are identical except for the order
    and choice of documents whose scores are *exactly* equal (bitwise, float64) -
    within a tie group and at the rank-10 boundary, where either side may pick any
    member of the group;
  - ``tie-aware (float32)``: the same with a relative tolerance of 1e-5, which also
    admits near-ties that bm25s's float32 arithmetic cannot separate.

  ``max rel score diff`` is the largest relative difference between bm25s's float32
  score and our float64 score for the same document. ``speed ratio`` is bm25s's p50
  retrieve time over ours (limit 10): above 1 means we are faster.

Timing hygiene: each timed loop is preceded by a warm-up of 20 queries and by
``gc.collect(); gc.freeze()``, so that collections traversing the benchmark's own data
(100k token lists) are not charged to the code under test. ``--blas-threads N`` sets
``OPENBLAS_NUM_THREADS`` before numpy loads: on a 2-core machine shared with other work,
one BLAS thread gives a slower median but a much steadier p99 for the vector product.

Prints a table and writes JSON (``--json``) with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

# --blas-threads must take effect before numpy loads OpenBLAS.
for _i, _a in enumerate(sys.argv):
    if _a == "--blas-threads" and _i + 1 < len(sys.argv):
        os.environ["OPENBLAS_NUM_THREADS"] = sys.argv[_i + 1]
        os.environ["OMP_NUM_THREADS"] = sys.argv[_i + 1]
    elif _a.startswith("--blas-threads="):
        os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = _a.split("=", 1)[1]

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_common.py

from _common import (  # noqa: E402
    HELD_OUT,
    bm25s_index,
    bm25s_query_ids,
    bm25s_retrieve_fn,
    compare_top10,
    load_messages,
    make_queries,
    need,
    timed,
)

from memmesh.node.memory.bm25 import InvertedIndex  # noqa: E402
from memmesh.node.memory.fusion import rrf  # noqa: E402
from memmesh.node.memory.tokens import tokenize  # noqa: E402
from memmesh.node.memory.vectors import VectorIndex  # noqa: E402

DIM = 384


def bench_size(n: int, corpus_tokens, queries, rnd_seed: int, bm25s) -> dict:
    docs = corpus_tokens[:n]
    out: dict = {"n_docs": n, "n_queries": len(queries)}

    t0 = time.perf_counter()
    ix = InvertedIndex()
    for i, toks in enumerate(docs):
        ix.add(i, toks)
    out["build_s_ours"] = time.perf_counter() - t0
    out["vocab"] = len(ix._vocab)
    out["avgdl"] = ix.avgdl
    out["max_df_fraction"] = max((ix._df[t] for t in range(len(ix._df))), default=0) / n
    qdf = [max((ix.df(t) for t in q), default=0) / n for q in queries]
    out["queries_with_token_in_10pct_of_docs"] = sum(f >= 0.10 for f in qdf) / len(queries)
    out["queries_with_repeated_token"] = sum(len(set(q)) < len(q) for q in queries) / len(queries)

    # bm25s on identical token ids.
    t0 = time.perf_counter()
    retriever, vocab = bm25s_index(bm25s, docs)
    out["build_s_bm25s"] = time.perf_counter() - t0
    q_ids = bm25s_query_ids(vocab, queries)
    b_retrieve = bm25s_retrieve_fn(retriever, n)
    b_results, out["bm25s_retrieve10"] = timed(b_retrieve, [(qi,) for qi in q_ids])

    qargs = [(q,) for q in queries]
    ours10, out["bm25_search10"] = timed(lambda q: ix.search(q, limit=10), qargs)
    bm100, out["bm25_search100"] = timed(lambda q: ix.search(q, limit=100), qargs)
    _, out["bm25_search_all"] = timed(lambda q: ix.search(q, limit=None), qargs)

    cmp = [compare_top10(ix, q, o, bi, bs) for q, o, (bi, bs) in zip(queries, ours10, b_results)]
    out["agree_strict"] = sum(c["strict"] for c in cmp) / len(cmp)
    out["agree_set"] = sum(c["set"] for c in cmp) / len(cmp)
    out["agree_tie"] = sum(c["tie"] for c in cmp) / len(cmp)
    out["agree_tie_f32"] = sum(c["tie32"] for c in cmp) / len(cmp)
    out["max_rel_score_diff"] = max(c["max_rel"] for c in cmp)
    out["disagreements"] = [
        {"query": q, "ours": [d for d, _ in o], "bm25s": [int(x) for x in bi]}
        for q, o, (bi, _), c in zip(queries, ours10, b_results, cmp)
        if not c["tie32"]
    ][:5]
    out["speed_ratio_bm25s_over_ours_p50"] = out["bm25s_retrieve10"]["p50_ms"] / out["bm25_search10"]["p50_ms"]

    # Vectors.
    rng = np.random.default_rng(rnd_seed)
    mat = rng.standard_normal((n, DIM), dtype=np.float32)
    vi = VectorIndex(DIM)
    t0 = time.perf_counter()
    for i in range(n):
        vi.add(i, mat[i])
    out["build_s_vectors"] = time.perf_counter() - t0
    qv = [(rng.standard_normal(DIM, dtype=np.float32),) for _ in queries]
    _, out["vec_search10"] = timed(lambda v: vi.search(v, limit=10), qv)
    vec100, out["vec_search100"] = timed(lambda v: vi.search(v, limit=100), qv)

    pairs = [([d for d, _ in a], [d for d, _ in b]) for a, b in zip(bm100, vec100)]
    _, out["rrf_100x2_to10"] = timed(lambda a, b: rrf([a, b], limit=10), pairs)

    def hybrid(q, v):
        a = ix.search(q, limit=100)
        b = vi.search(v, limit=100)
        return rrf([[d for d, _ in a], [d for d, _ in b]], limit=10)

    _, out["hybrid"] = timed(hybrid, [(q, v[0]) for q, v in zip(queries, qv)])

    keys = {i: (i * 2654435761) % 2**32 for i in range(n)}  # stand-in causal-order key
    hidden = set(range(0, n, 10))  # stand-in tag filter: 90% of rows pass

    def hybrid_cb(q, v):
        allowed = lambda d: d not in hidden  # noqa: E731
        tb = keys.__getitem__
        a = ix.search(q, limit=100, allowed=allowed, tiebreak=tb)
        b = vi.search(v, limit=100, allowed=allowed, tiebreak=tb)
        return rrf([[d for d, _ in a], [d for d, _ in b]], limit=10, tiebreak=tb)

    _, out["hybrid_callbacks"] = timed(hybrid_cb, [(q, v[0]) for q, v in zip(queries, qv)])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N = 1k and 10k only")
    ap.add_argument("--json", type=Path, help="write all figures to this file")
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument(
        "--blas-threads",
        type=int,
        help="set OPENBLAS_NUM_THREADS for this run (default: the environment's / OpenBLAS's own)",
    )
    args = ap.parse_args(argv)
    os.environ.setdefault("DISABLE_TQDM", "1")
    bm25s = need("bm25s", "bm25s", "recall_core")

    msgs = load_messages(args.seed)
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    if len(msgs) < max(sizes) + HELD_OUT:
        sys.exit("recall_core: dataset too small")
    corpus_tokens = [tokenize(m) for m in msgs[: max(sizes)]]
    held_out = [tokenize(m) for m in msgs[-HELD_OUT:]]
    queries = make_queries(held_out, args.queries, random.Random(args.seed + 1))

    report = {
        "bench": "recall_core",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "bm25s": getattr(bm25s, "__version__", "?"),
        "cpus": os.cpu_count(),
        "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default"),
        "seed": args.seed,
        "dim": DIM,
        "sizes": [],
    }
    for n in sizes:
        r = bench_size(n, corpus_tokens, queries, args.seed + n, bm25s)
        report["sizes"].append(r)
        print(f"done N={n}", file=sys.stderr, flush=True)

    rows = [
        ("build ours / bm25s / vectors (s)", lambda r: f"{r['build_s_ours']:.2f} / {r['build_s_bm25s']:.2f} / {r['build_s_vectors']:.2f}"),
        ("BM25 search limit=10 p50/p99 ms", lambda r: f"{r['bm25_search10']['p50_ms']:.3f} / {r['bm25_search10']['p99_ms']:.3f}"),
        ("BM25 search limit=100 p50/p99 ms", lambda r: f"{r['bm25_search100']['p50_ms']:.3f} / {r['bm25_search100']['p99_ms']:.3f}"),
        ("BM25 search limit=None p50/p99 ms", lambda r: f"{r['bm25_search_all']['p50_ms']:.3f} / {r['bm25_search_all']['p99_ms']:.3f}"),
        ("bm25s retrieve k=10 p50/p99 ms", lambda r: f"{r['bm25s_retrieve10']['p50_ms']:.3f} / {r['bm25s_retrieve10']['p99_ms']:.3f}"),
        ("speed ratio bm25s/ours (p50)", lambda r: f"{r['speed_ratio_bm25s_over_ours_p50']:.2f}x"),
        ("top-10 strict / same set", lambda r: f"{100 * r['agree_strict']:.1f}% / {100 * r['agree_set']:.1f}%"),
        ("top-10 tie-aware exact / f32", lambda r: f"{100 * r['agree_tie']:.1f}% / {100 * r['agree_tie_f32']:.1f}%"),
        ("max rel score diff vs bm25s", lambda r: f"{r['max_rel_score_diff']:.1e}"),
        ("vector search limit=10 p50/p99 ms", lambda r: f"{r['vec_search10']['p50_ms']:.3f} / {r['vec_search10']['p99_ms']:.3f}"),
        ("vector search limit=100 p50/p99 ms", lambda r: f"{r['vec_search100']['p50_ms']:.3f} / {r['vec_search100']['p99_ms']:.3f}"),
        ("RRF 2x100 -> 10 p50/p99 ms", lambda r: f"{r['rrf_100x2_to10']['p50_ms']:.3f} / {r['rrf_100x2_to10']['p99_ms']:.3f}"),
        ("hybrid p50/p99 ms", lambda r: f"{r['hybrid']['p50_ms']:.2f} / {r['hybrid']['p99_ms']:.2f}"),
        ("hybrid + callbacks p50/p99 ms", lambda r: f"{r['hybrid_callbacks']['p50_ms']:.2f} / {r['hybrid_callbacks']['p99_ms']:.2f}"),
        ("queries w/ a token in >=10% docs", lambda r: f"{100 * r['queries_with_token_in_10pct_of_docs']:.0f}%"),
        ("queries w/ a repeated token", lambda r: f"{100 * r['queries_with_repeated_token']:.1f}%"),
    ]
    w = max(len(name) for name, _ in rows)
    cols = [f"N={r['n_docs']:,}" for r in report["sizes"]]
    cw = 24
    print(f"{'':{w}}  " + "".join(f"{c:>{cw}}" for c in cols))
    for name, fmt in rows:
        print(f"{name:{w}}  " + "".join(f"{fmt(r):>{cw}}" for r in report["sizes"]))
    for r in report["sizes"]:
        for d in r["disagreements"]:
            print(f"disagreement N={r['n_docs']}: {d}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
