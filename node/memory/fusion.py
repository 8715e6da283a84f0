"""Deterministic ordering of scored candidates, and Reciprocal Rank Fusion.

Ordering (:func:`rank_candidates`, used by BM25, vectors and RRF alike)
-------------------------------------------------------------------------
Results are sorted by ``(-score, tiebreak(doc_id))``. Two candidates tie only when
their float64 scores are bitwise equal; the scorers compute every score with a fixed
sequence of IEEE-754 operations that does not depend on insertion order, row position
or query-token order, so replicas holding the same rows see the same ties and resolve
them with the same caller-supplied ``tiebreak`` key (default: the doc id itself).
Memory recall passes a key derived from causal order, never wall-clock time.

``tiebreak`` is called only for members of tie groups (a group of one needs no key)
within the part of the ranking that is returned; ``allowed`` is called lazily while
walking down the ranking when ``limit`` is set, so a selective filter or a large tie
group costs Python calls in proportion to the part of the ranking consumed, not to the
candidate count (with ``limit=None`` every candidate is checked once). Selection is
numpy: ``np.partition`` picks a prefix of the best ``max(4 * limit, 64)`` scores,
extended to the end of its last tie group so that a tie group is never split between
two prefixes; the prefix is sorted with ``np.lexsort`` by ``(-score, id)``; if the filter
leaves fewer than ``limit`` results the next, four times larger prefix follows.

Reciprocal Rank Fusion (:func:`rrf`)
------------------------------------
``score(d) = sum over lists L containing d of 1 / (k + rank_L(d))``, ranks from 1,
``k = 60`` by default. Each id's terms are added in float64 in a canonical order (best
rank first, starting from 0.0), so the result is reproducible bit for bit and two ids
with the same multiset of ranks get exactly the same score whatever lists they came
from (a true tie, resolved by ``tiebreak``). A list may not contain the same id twice
(ValueError).

Age decay (:func:`decayed`)
---------------------------
Optional, per kind of memory: a score times ``0.5 ** (age_days / half_life)``, the age from
the row's signed timestamp to the caller's explicit "now" (never the clock read here), so the
same rows and the same now give the same ranking on every replica. The re-sort is stable:
rows whose decayed scores are bitwise equal keep the order the ranking above gave them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["DAY_MS", "RRF_K", "decay_factor", "decayed", "rank_candidates", "rrf"]

DAY_MS = 86_400_000

RRF_K = 60

Tiebreak = Callable[[int], Any]
Allowed = Callable[[int], bool]

# Below this many candidates a plain full sort is cheaper than prefix selection.
_SMALL = 256


def _check_limit(limit: int | None) -> None:
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 0:
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")


def _emit_sorted(
    ids: np.ndarray,
    scores: np.ndarray,
    out: list[tuple[int, float]],
    limit: int | None,
    allowed: Allowed | None,
    tiebreak: Tiebreak | None,
) -> bool:
    """Append ``ids`` (already sorted by descending score) to ``out`` in final order.

    Returns True when ``out`` reached ``limit``.
    """
    n = len(ids)
    if n and allowed is not None and (limit is None or n <= limit - len(out)):
        # Everything will be consumed anyway: filter in one pass, then go vectorised.
        keep = np.fromiter((bool(allowed(d)) for d in ids.tolist()), dtype=bool, count=n)
        ids, scores, n, allowed = ids[keep], scores[keep], int(keep.sum()), None
    if n == 0:
        return limit is not None and len(out) >= limit
    if allowed is None:
        need = n if limit is None else min(n, limit - len(out))
        if need < n:
            # Cut after the tie group that contains position need - 1.
            n = int(np.searchsorted(-scores, -scores[need - 1], side="right"))
            ids, scores = ids[:n], scores[:n]
        id_list = ids.tolist()
        if n > 1 and tiebreak is not None:
            # Tie groups of two or more: order their members by the caller's key
            # (they arrive ordered by id, which is the default key).
            same = scores[1:] == scores[:-1]
            if same.any():
                edges = np.flatnonzero(np.diff(np.concatenate(([False], same, [False])).astype(np.int8)))
                for a, b in zip(edges[0::2].tolist(), edges[1::2].tolist()):
                    id_list[a : b + 1] = sorted(id_list[a : b + 1], key=tiebreak)
        out.extend(zip(id_list[:need], scores[:need].tolist()))
        return limit is not None and len(out) >= limit
    # Lazy walk: allowed() is called only as far down as needed.
    starts = np.flatnonzero(np.concatenate(([True], scores[1:] != scores[:-1])))
    bounds = np.append(starts, n).tolist()
    id_list = ids.tolist()
    score_list = scores.tolist()
    for g in range(len(bounds) - 1):
        a, b = bounds[g], bounds[g + 1]
        if b - a == 1:
            d = id_list[a]
            if allowed(d):
                out.append((d, score_list[a]))
                if limit is not None and len(out) >= limit:
                    return True
            continue
        members = [d for d in id_list[a:b] if allowed(d)]
        if len(members) > 1:
            members.sort(key=tiebreak)
        s = score_list[a]
        for d in members:
            out.append((d, s))
            if limit is not None and len(out) >= limit:
                return True
    return False


def rank_candidates(
    ids: np.ndarray | Sequence[int],
    scores: np.ndarray | Sequence[float],
    *,
    limit: int | None,
    allowed: Allowed | None = None,
    tiebreak: Tiebreak | None = None,
) -> list[tuple[int, float]]:
    """Order ``(id, score)`` pairs by ``(-score, tiebreak(id))``, keep those for which
    ``allowed(id)`` is true, and return at most ``limit`` of them (all if None).

    ``ids`` must be distinct. Scores are compared as float64.
    """
    _check_limit(limit)
    ids = np.asarray(ids, dtype=np.int64)
    scores = np.asarray(scores, dtype=np.float64)
    if ids.shape != scores.shape or ids.ndim != 1:
        raise ValueError("ids and scores must be 1-d arrays of the same length")
    out: list[tuple[int, float]] = []
    n = len(ids)
    if n == 0 or limit == 0:
        return out
    if limit is None or n <= _SMALL:
        # Sorting by (-score, id) makes the default tiebreak free; a caller's key
        # reorders tie groups afterwards.
        order = np.lexsort((ids, -scores))
        _emit_sorted(ids[order], scores[order], out, limit, allowed, tiebreak)
        return out
    # Walk down the ranking in growing prefixes that end on a score boundary.
    remaining_ids, remaining_scores = ids, scores
    m = max(4 * limit, 64)
    while True:
        r = len(remaining_ids)
        if m >= r:
            order = np.lexsort((remaining_ids, -remaining_scores))
            _emit_sorted(remaining_ids[order], remaining_scores[order], out, limit, allowed, tiebreak)
            return out
        neg = -remaining_scores
        kth = np.partition(neg, m - 1)[m - 1]
        take = neg <= kth  # everything scoring >= the m-th best: whole tie groups
        p_ids, p_scores = remaining_ids[take], remaining_scores[take]
        order = np.lexsort((p_ids, -p_scores))
        if _emit_sorted(p_ids[order], p_scores[order], out, limit, allowed, tiebreak):
            return out
        rest = ~take
        remaining_ids, remaining_scores = remaining_ids[rest], remaining_scores[rest]
        if len(remaining_ids) == 0:
            return out
        m *= 4


def rrf(
    ranked_lists: Sequence[Sequence[int] | np.ndarray],
    k: int = RRF_K,
    *,
    limit: int | None = None,
    allowed: Allowed | None = None,
    tiebreak: Tiebreak | None = None,
) -> list[tuple[int, float]]:
    """Reciprocal Rank Fusion of best-first id lists.

    ``score(d) = sum over lists of 1 / (k + rank)``, rank from 1; returned best first,
    ties (frequent: first in one list only vs first in another only) broken by
    ``tiebreak(id)`` (default: the id). ``allowed`` and ``limit`` as in
    :func:`rank_candidates`.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"k must be a non-negative integer, got {k!r}")
    _check_limit(limit)
    arrays = [np.asarray(lst, dtype=np.int64).reshape(-1) for lst in ranked_lists]
    for a in arrays:
        if len(a) > 1 and len(np.unique(a)) != len(a):
            raise ValueError("a ranked list contains the same id more than once")
    arrays = [a for a in arrays if len(a)]
    if not arrays:
        return []
    all_ids = np.concatenate(arrays)
    ranks = np.concatenate([np.arange(1, len(a) + 1, dtype=np.int64) for a in arrays])
    # 1 / (k + rank), rank from 1; float64, correctly rounded division.
    weights = 1.0 / (float(k) + ranks.astype(np.float64))
    uniq, inverse = np.unique(all_ids, return_inverse=True)
    # Canonical summation order per id: best rank first. bincount adds the weights in
    # input order, exactly like adding them one by one starting from 0.0.
    order = np.lexsort((ranks, inverse))
    fused = np.bincount(inverse[order], weights=weights[order], minlength=len(uniq))
    return rank_candidates(uniq, fused, limit=limit, allowed=allowed, tiebreak=tiebreak)


# How far importance and confidence (1-10) move a score (docs/memory.md, "Importance and
# confidence"): importance 1-10 gives 0.84-1.2, confidence 0.92-1.1, 5 or none gives 1. Bounded,
# so a field never outranks a much better match, only a close one; importance weighs more,
# since it is what the writer says matters.
IMPORTANCE_WEIGHT = 0.2
CONFIDENCE_WEIGHT = 0.1


def salience_factor(importance: int | None, confidence: int | None) -> float:
    """The factor a row's importance and confidence put on its fused score; 1 without them."""
    f = 1.0
    if importance is not None:
        f *= 1.0 + IMPORTANCE_WEIGHT * (importance - 5) / 5
    if confidence is not None:
        f *= 1.0 + CONFIDENCE_WEIGHT * (confidence - 5) / 5
    return f


def decay_factor(age_ms: int, half_life_days: float | None) -> float:
    """``0.5 ** (age_days / half_life_days)``; 1.0 with no half-life, and for a row dated after
    "now" (a writer's clock ahead of ours does not make a row fresher than new)."""
    if half_life_days is None or age_ms <= 0:
        return 1.0
    return float(0.5 ** ((age_ms / DAY_MS) / half_life_days))


def decayed(hits: Sequence[tuple[Any, float]], factor: Callable[[Any], float]) -> list[tuple[Any, float]]:
    """``hits`` (best first) with each score multiplied by ``factor(item)``, best first again."""
    scored = [(item, score * factor(item)) for item, score in hits]
    return sorted(scored, key=lambda pair: -pair[1])  # stable: equal scores keep their rank
