"""Fit each shipped embedder's relevance floor: the cosine below which a vector-only match is
not a result (docs/memory.md, "Relevance floor").

Usage::

    python bench/calibrate_floor.py [--json PATH] [--quantile Q]

On the calibration set of bench/floor_data.py (a household's memories; general-knowledge
questions that share no topic with them), for each embedder: every unrelated question is
embedded the way auto-recall embeds a message (its query tokens, stopwords removed), and its
best cosine against the stored memories (``key + " " + value``, as ``remember`` embeds them)
is taken. The floor is that best cosine's ``--quantile`` (default 0.98) over the unrelated
questions, rounded up to two decimals: at most about 2 % of unrelated messages still reach a
memory through vectors alone. The script also reports how many on-topic questions (one per
memory, worded without the memory's words where possible) clear the floor on their own
memory, which is what the floor may cost; BM25 still finds a question that shares a word.

The floors in node/memory/relevance.py were produced by this script; tests check that the
hashed embedder's floor (deterministic, no model files) is what this procedure gives.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from _common import machine  # noqa: E402
from floor_data import memories, unrelated  # noqa: E402

from memmesh.node.memory.embedders import EmbedderConfig, make_embedder  # noqa: E402
from memmesh.node.memory.tokens import autorecall_query_tokens  # noqa: E402

SEED = 7


def as_query(message: str) -> str:
    return " ".join(autorecall_query_tokens([message]))


def fit(provider: str, quantile: float) -> dict[str, Any]:
    embedder = make_embedder(EmbedderConfig(provider))
    assert embedder is not None
    facts = memories(random.Random(SEED))
    stored = embedder.embed([f"{f.key} {f.value}" for f in facts])
    negatives = embedder.embed([as_query(m) for m in unrelated()])
    positives = embedder.embed([as_query(f.question) for f in facts])
    neg_best = (negatives @ stored.T).max(axis=1)
    pos_own = np.einsum("ij,ij->i", positives, stored)
    floor = math.ceil(float(np.quantile(neg_best, quantile)) * 100) / 100
    return {
        "provider": provider, "model": embedder.model, "store": embedder.store_name,
        "memories": len(facts), "unrelated": len(neg_best),
        "unrelated_best_cosine": {"p50": round(float(np.median(neg_best)), 4),
                                  "p90": round(float(np.quantile(neg_best, 0.9)), 4),
                                  "max": round(float(neg_best.max()), 4)},
        "on_topic_own_cosine": {"p10": round(float(np.quantile(pos_own, 0.1)), 4),
                                "p50": round(float(np.median(pos_own)), 4)},
        "floor": floor,
        "unrelated_above_floor_frac": round(float((neg_best >= floor).mean()), 4),
        "on_topic_above_floor_frac": round(float((pos_own >= floor).mean()), 4),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=HERE / "results" / "floor.json")
    ap.add_argument("--quantile", type=float, default=0.98)
    ap.add_argument("--providers", default="local,hashed")
    args = ap.parse_args()
    results = [fit(p, args.quantile) for p in args.providers.split(",")]
    print("store | unrelated best cos p50/p90/max | on-topic own cos p10/p50 | floor | unrelated above | on-topic above")
    for r in results:
        u, o = r["unrelated_best_cosine"], r["on_topic_own_cosine"]
        print(f"{r['store']} | {u['p50']}/{u['p90']}/{u['max']} | {o['p10']}/{o['p50']} | {r['floor']} | "
              f"{r['unrelated_above_floor_frac']} | {r['on_topic_above_floor_frac']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"bench": "calibrate_floor", "machine": machine(), "quantile": args.quantile,
                                     "results": results}, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
