"""The relevance floor: the cosine below which a match found by vectors alone is not a result.

A sentence embedder gives every pair of texts some similarity: with all-MiniLM-L6-v2 two
unrelated sentences score about 0.1-0.3, almost never <= 0, so the spec's rule "cosine <= 0
dropped" drops nothing and recall would always answer, however far off the query. Each
shipped embedder therefore has a floor fitted to its vector space, kept with the model's
identity (the ``embeddings:<provider>/<model>`` store name its vectors live in): a memory that
only the cosine list found, with a cosine below the floor, is left out of the fused ranking.
BM25 keeps its own rule (no shared token, no result), so a memory sharing a word with the
query is still returned whatever its cosine, and the ranking of what is returned is exactly
the one without a floor (docs/memory.md, "Relevance floor").

The floors below come from bench/calibrate_floor.py on its own generated data (a household's
memories; general-knowledge questions and small talk; never the evaluation set of
bench/relevance.py): the 98th percentile of the best cosine an unrelated message reaches,
rounded up to two decimals. An embedder without a calibration (another model, a remote API, another hashed
dimension) keeps the spec's floor of 0. An agent's ``min_similarity`` overrides the floor for
its recall and auto-recall.
"""
from __future__ import annotations

SPEC_FLOOR = 0.0  # the spec: cosine <= 0 dropped (node/memory/vectors.py drops those anyway)

FLOORS: dict[str, float] = {
    "embeddings:local/all-minilm-l6-v2-int8": 0.29,
    "embeddings:hashed/hashed-v1-384": 0.22,
}


def floor_for(store: str | None) -> float:
    """The calibrated floor of the embedder whose vectors live in ``store``, else the spec's."""
    if store is None:
        return SPEC_FLOOR
    return FLOORS.get(store, SPEC_FLOOR)
