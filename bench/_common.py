"""Helpers shared by the recall benchmarks (bench/recall_core.py, bench/recall.py).

Corpus and queries (Chit-Chat dataset), timing with percentiles, the bm25s reference index
fed our own tokens, and the strict / tie-aware top-10 comparison. Numpy is imported here, so
a script that wants ``OPENBLAS_NUM_THREADS`` set must set it before importing this module.
"""

from __future__ import annotations

import gc
import random
import sys
import time

import numpy as np

HELD_OUT = 10_000  # the last HELD_OUT shuffled messages are never indexed: queries come from them
TOL_F32 = 1e-5


def need(pkg: str, pip_name: str, bench: str):
    """Import a bench-only dependency or exit with an install hint."""
    try:
        return __import__(pkg)
    except ImportError:
        sys.exit(f"{bench}: this benchmark needs '{pip_name}' (pip install {pip_name})")


def load_messages(seed: int) -> list[str]:
    """Every non-blank Chit-Chat message, shuffled with ``seed``."""
    chitchat = need("chitchat_dataset", "chitchat-dataset", "bench")
    msgs = [m for m in chitchat.MessageDataset() if m.strip()]
    random.Random(seed).shuffle(msgs)
    return msgs


def make_queries(held_out: list[list[str]], n: int, rnd: random.Random) -> list[list[str]]:
    """``n`` queries of 2-6 tokens sampled from held-out messages with >= 2 tokens."""
    pool = [t for t in held_out if len(t) >= 2]
    out = []
    for _ in range(n):
        toks = rnd.choice(pool)
        k = rnd.randint(2, min(6, len(toks)))
        out.append(rnd.sample(toks, k))
    return out


def pct(samples_ns: list[int]) -> dict[str, float]:
    a = np.asarray(samples_ns, dtype=np.float64) / 1e6
    return {
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "mean_ms": float(a.mean()),
        "max_ms": float(a.max()),
    }


def timed(fn, args_list, warmup: int = 20) -> tuple[list, dict[str, float]]:
    """Run ``fn(*a)`` for every ``a`` (after a warm-up); results and latency percentiles."""
    for a in args_list[:warmup]:
        fn(*a)
    # The benchmark's own data (token lists) would otherwise be traversed by full
    # collections during timing; freeze what exists so only the code under test counts.
    gc.collect()
    gc.freeze()
    results, samples = [], []
    for a in args_list:
        t0 = time.perf_counter_ns()
        r = fn(*a)
        samples.append(time.perf_counter_ns() - t0)
        results.append(r)
    return results, pct(samples)


def bm25s_index(bm25s, docs: list[list[str]]):
    """A bm25s ``lucene`` index (k1=1.5, b=0.75) of pre-tokenised docs; ``(retriever, vocab)``.

    bm25s is given the corpus as ``(token ids, vocab)`` so it sees exactly our tokens.
    """
    vocab: dict[str, int] = {}
    ids = [[vocab.setdefault(t, len(vocab)) for t in toks] for toks in docs]
    retriever = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
    retriever.index((ids, dict(vocab)), show_progress=False)
    return retriever, vocab


def bm25s_query_ids(vocab: dict[str, int], queries: list[list[str]]) -> list[list[int]]:
    """Each query as its list of known token ids (duplicates kept)."""
    return [[vocab[t] for t in q if t in vocab] for q in queries]


def bm25s_retrieve_fn(retriever, n_docs: int, k: int = 10):
    """``f(query ids) -> (doc ids, float32 scores)`` of bm25s's top ``k``."""

    def b_retrieve(qi):
        if not qi:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
        res, sc = retriever.retrieve([qi], k=min(k, n_docs), show_progress=False, n_threads=0)
        return res[0], sc[0]

    return b_retrieve


def exact_scores(ix, q: list[str]) -> dict[int, float]:
    """Our float64 BM25 score of every document matching ``q`` (``ix``: an InvertedIndex)."""
    ids, scores = ix.scores(q)
    return dict(zip(ids.tolist(), scores.tolist()))


def compare_top10(ix, q: list[str], ours, b_ids, b_scores, exact: dict[int, float] | None = None) -> dict:
    """Compare our ranked ``[(doc, score)]`` with bm25s's top 10 for query ``q``.

    ``strict``: identical id lists; ``tie``: identical except for the order and choice of
    documents whose float64 scores are exactly equal; ``tie32``: the same with relative
    tolerance TOL_F32; ``max_rel``: largest relative score difference; ``set``: same ids.
    ``exact`` (optional) is ``exact_scores(ix, q)`` when the caller already has it.
    """
    b = [(int(d), float(s)) for d, s in zip(b_ids, b_scores) if s > 0]
    ours_ids = [d for d, _ in ours]
    strict = ours_ids == [d for d, _ in b]
    if exact is None:
        exact = exact_scores(ix, q)
    tie = len(ours) == len(b)
    tie32 = tie
    max_rel = 0.0
    for (_, os_), (bd, _) in zip(ours, b):
        mine = exact.get(bd, 0.0)
        if mine != os_:
            tie = False
        if abs(mine - os_) > TOL_F32 * max(abs(os_), 1e-12):
            tie32 = False
    for bd, bs in b:
        mine = exact.get(bd)
        if mine:
            max_rel = max(max_rel, abs(bs - mine) / mine)
    return {"strict": strict, "tie": tie, "tie32": tie32, "max_rel": max_rel, "set": set(ours_ids) == {d for d, _ in b}}


def machine() -> dict[str, str | int]:
    """What the figures were measured on: CPU model, cores, Python, system."""
    import os
    import platform
    from pathlib import Path

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count() or 0, "python": platform.python_version(),
            "system": f"{platform.system()} {platform.release()}"}
