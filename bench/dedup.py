"""Fit and measure each shipped embedder's near-duplicate threshold (docs/memory.md,
"Near-duplicates"; docs/benchmarks.md, "Near-duplicates").

Usage::

    python bench/dedup.py [--json PATH] [--providers local,hashed] [--precision 0.95]

On the generated pairs of bench/dedup_data.py (one fact in other words under another key;
different facts on the same topic), each memory is embedded as ``remember`` embeds it
(``key + " " + value``) and each pair's cosine taken. A pair at or above a threshold is called
a duplicate. The threshold is the lowest on a grid of 0.01 from which every higher threshold
(that still calls some pair) has a precision of at least ``--precision`` on this set: the
lowest, for the most recall; every higher one, so that a small step up never does worse than
promised. Reported: precision and recall there (and on held-out topics written after the fit,
never fitted on), how many same-topic different facts and how
many updates (one attribute, another value) are called duplicates, and the cosines of each
kind; and what the check costs a remember in banks of ``--cost`` sizes. Figures: table printed,
JSON written.

The thresholds in node/memory/dedup.py were produced by this script; a test checks that the
hashed embedder's (deterministic, no model files) is what this fit gives.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from _common import machine  # noqa: E402
from dedup_data import HELD_OUT, TOPICS, pairs  # noqa: E402

from memmesh.node.memory.embedders import EmbedderConfig, make_embedder  # noqa: E402

SEED = 7


def cosines(provider: str, seed: int = SEED, held_out: bool = False) -> tuple[str, str, list[str], np.ndarray]:
    """The store, the model, each pair's kind and each pair's cosine."""
    embedder = make_embedder(EmbedderConfig(provider))
    assert embedder is not None
    ps = pairs(seed, held_out=held_out)
    texts = sorted({m.text for p in ps for m in (p.a, p.b)})
    vecs = dict(zip(texts, embedder.embed(texts)))
    cos = np.array([float(np.dot(vecs[p.a.text], vecs[p.b.text])) for p in ps], dtype=np.float64)
    return embedder.store_name, embedder.model, [p.kind for p in ps], cos


def scores(is_dup: np.ndarray, cos: np.ndarray, threshold: float) -> tuple[float | None, float, int]:
    """Precision (None when nothing is called a duplicate), recall, and pairs called."""
    called = cos >= threshold
    n = int(called.sum())
    tp = int((called & is_dup).sum())
    return (tp / n if n else None), tp / max(1, int(is_dup.sum())), n


def choose(is_dup: np.ndarray, cos: np.ndarray, target: float) -> float | None:
    """The lowest threshold of the 0.01 grid from which every higher one reaches ``target``
    precision (None: none does)."""
    chosen = None
    for step in range(100, -1, -1):  # from 1.00 down
        t = step / 100
        precision, _recall, _n = scores(is_dup, cos, t)
        if precision is None:
            continue
        if precision < target:
            break
        chosen = t
    return chosen


def fit(provider: str, target: float = 0.95, seed: int = SEED) -> dict[str, Any]:
    started = time.perf_counter()
    store, model, kinds, cos = cosines(provider, seed)
    kind = np.array(kinds)
    fitted = kind != "update"
    is_dup = kind[fitted] == "duplicate"
    threshold = choose(is_dup, cos[fitted], target)
    out: dict[str, Any] = {
        "provider": provider, "model": model, "store": store, "topics": len(TOPICS),
        "duplicate_pairs": int(is_dup.sum()), "different_pairs": int((~is_dup).sum()),
        "update_pairs": int((kind == "update").sum()), "target_precision": target, "threshold": threshold,
        "cosine": {k: {"p10": round(float(np.quantile(cos[kind == k], 0.1)), 4),
                       "p50": round(float(np.median(cos[kind == k])), 4),
                       "p90": round(float(np.quantile(cos[kind == k], 0.9)), 4)}
                   for k in ("duplicate", "different", "update")},
    }
    if threshold is not None:
        precision, recall, called = scores(is_dup, cos[fitted], threshold)
        out.update(precision=round(float(precision or 0.0), 4), recall=round(recall, 4), called=called,
                   different_called=int(((cos[fitted] >= threshold) & ~is_dup).sum()),
                   updates_called_frac=round(float((cos[kind == "update"] >= threshold).mean()), 4))
        # The held-out topics (bench/dedup_data.py), never used to fit: the same measures.
        _s, _m, h_kinds, h_cos = cosines(provider, seed, held_out=True)
        h_kind = np.array(h_kinds)
        h_fitted = h_kind != "update"
        h_dup = h_kind[h_fitted] == "duplicate"
        h_precision, h_recall, h_called = scores(h_dup, h_cos[h_fitted], threshold)
        out["held_out"] = {"topics": len(HELD_OUT), "duplicate_pairs": int(h_dup.sum()),
                           "different_pairs": int((~h_dup).sum()), "called": h_called,
                           "precision": None if h_precision is None else round(h_precision, 4),
                           "recall": round(h_recall, 4),
                           "different_called": int(((h_cos[h_fitted] >= threshold) & ~h_dup).sum()),
                           "updates_called_frac": round(float((h_cos[h_kind == "update"] >= threshold).mean()), 4)}
    out["seconds"] = round(time.perf_counter() - started, 2)
    return out


def cost(n: int, repeats: int = 20) -> dict[str, Any]:
    """What the check costs a new key's remember in a bank of ``n`` current memories, each with
    a 384-value vector: node/memory/dedup.py's ``find_duplicate`` when nothing matches (the
    whole pass: every value compared, the nearest vectors looked up), median of ``repeats``."""
    from memmesh.auth.keys import SigningKey
    from memmesh.crdt.database import Database
    from memmesh.crdt.storage import MemoryStorage
    from memmesh.node.memory.dedup import find_duplicate
    from memmesh.node.memory.embedding_rows import embedding_value
    from memmesh.node.memory.rows import MEMORY_STORE, memory_value
    from memmesh.node.memory.view import MemoryView

    store = "embeddings:hashed/hashed-v1-384"
    admin = SigningKey.from_seed(bytes([1]) * 32)
    db = Database.create(MemoryStorage(), admin, meta={"kind": "bank", "display_name": "dedup-cost"})
    rng = np.random.default_rng(SEED)
    for start in range(0, n, 400):
        txn = db.transaction(admin)
        for i in range(start, min(n, start + 400)):
            row = txn.append(MEMORY_STORE, memory_value(f"k{i}", f"memory number {i} about item {i * 7}"))
            v = rng.standard_normal(384).astype(np.float32)
            txn.append(store, embedding_value(row, v / np.linalg.norm(v)))
        txn.commit()
    view = MemoryView(db, embedding_store=store, dim=384)
    q = rng.standard_normal(384).astype(np.float32)
    q /= np.linalg.norm(q)
    find_duplicate(view, "a value no memory has", q, now=0)  # warm: the index is built
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        assert find_duplicate(view, "a value no memory has", q, now=0) is None
        samples.append(time.perf_counter() - t0)
    return {"memories": n, "check_ms_p50": round(float(np.median(samples)) * 1000, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=HERE / "results" / "dedup.json")
    ap.add_argument("--precision", type=float, default=0.95)
    ap.add_argument("--providers", default="local,hashed")
    ap.add_argument("--cost", default="1000,10000,100000",
                    help="bank sizes to time the check at (comma-separated; empty: none)")
    args = ap.parse_args()
    results = [fit(p, args.precision) for p in args.providers.split(",")]
    print("store | pairs dup/different/update | cosine p50 dup/different/update | threshold | precision | "
          "recall | different called | updates called")
    for r in results:
        c = r["cosine"]
        print(f"{r['store']} | {r['duplicate_pairs']}/{r['different_pairs']}/{r['update_pairs']} | "
              f"{c['duplicate']['p50']}/{c['different']['p50']}/{c['update']['p50']} | {r['threshold']} | "
              f"{r.get('precision', '-')} | {r.get('recall', '-')} | {r.get('different_called', '-')} | "
              f"{r.get('updates_called_frac', '-')}")
    print("held out (never fitted on): store | pairs dup/different | precision | recall | different called | "
          "updates called")
    for r in results:
        h = r.get("held_out")
        if h:
            print(f"{r['store']} | {h['duplicate_pairs']}/{h['different_pairs']} | {h['precision']} | {h['recall']} | "
                  f"{h['different_called']} | {h['updates_called_frac']}")
    costs = [cost(int(n)) for n in args.cost.split(",") if n.strip()]
    for c in costs:
        print(f"check of a new key against {c['memories']:,} memories: {c['check_ms_p50']} ms (median)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"bench": "dedup", "machine": machine(), "date": time.strftime("%Y-%m-%d"),
                                     "precision_target": args.precision, "results": results, "cost": costs},
                                    indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
