"""The quantised first pass of VectorIndex (node/memory/quantised.py, docs/memory.md "Quantised first pass").

A lowered threshold and candidate depth (constructor arguments) make the pass run on a few rows.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memmesh.node.memory.quantised import quantise_query, quantise_rows
from memmesh.node.memory.vectors import QUANTISE_FROM, VectorIndex

DIM = 6
_vec = st.lists(st.integers(-3, 3), min_size=DIM, max_size=DIM)  # small integers: many exact ties
_FEW = [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [2, 1, 0, -1, 0, 0]]
_rows = st.lists(st.one_of(_vec, st.sampled_from(_FEW)), min_size=1, max_size=40)  # repeated rows: whole tie groups


def _quantised(**kw) -> VectorIndex:
    return VectorIndex(DIM, quantise_from=0, candidate_factor=1, candidate_min=1, **kw)


def _queries(rnd: random.Random) -> list[np.ndarray]:
    return [np.array([rnd.randint(-3, 3) for _ in range(DIM)], dtype=np.float64) for _ in range(4)] + [np.ones(DIM)]


def _tiebreak(d: int) -> int:
    return (d * 7919) % 101  # a caller's order unrelated to the ids or the rows


def _answers(index: VectorIndex, rnd: random.Random, n_ids: int) -> list:
    out = []
    mask = np.array([rnd.random() < 0.6 for _ in range(n_ids)])
    for q in _queries(rnd) + [np.array(_FEW[1], dtype=np.float64)]:
        for limit in (1, 2, 5):
            out.append(index.search(q, limit=limit, tiebreak=_tiebreak))
            out.append(index.search(q, limit=limit, tiebreak=_tiebreak, mask=mask))
            out.append(index.search(q, limit=limit, tiebreak=_tiebreak, allowed=lambda d: d % 3 != 0))
    return out


def _codes_of(index: VectorIndex) -> dict[int, tuple[bytes, int]]:
    """doc id -> (its int8 code, its shift), from the index's own copy."""
    assert index._codes is not None
    ids, _ = index.units()
    return {int(d): (index._codes.codes[:, r].tobytes(), int(index._codes.shifts[r])) for r, d in enumerate(ids)}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_rows, st.randoms(use_true_random=False))
def test_same_answers_whatever_the_insertion_order_and_history(rows, rnd):
    # Two replicas: one loads the rows in bulk, the other adds them in another order, one way or
    # another, and removes and re-adds some (rows move in its matrix). Same answers, bit for bit.
    a = _quantised()
    a.add_many(range(len(rows)), np.array(rows, dtype=np.float64))
    b = _quantised()
    order = list(range(len(rows)))
    rnd.shuffle(order)
    for d in order:
        how = rnd.randint(0, 2)
        if how == 0:
            b.add(d, np.array(rows[d]))
        elif how == 1:
            b.add_many([d], [np.array(rows[d])])
        else:
            b.add_unit(d, a.vector(d))
    for d in rnd.sample(order, len(order) // 2):
        unit = b.vector(d)
        b.remove(d)
        b.add_unit(d, unit)
    seed = rnd.random()
    assert _answers(a, random.Random(seed), len(rows)) == _answers(b, random.Random(seed), len(rows))
    # The codes kept in step are those a bulk build gives.
    assert _codes_of(b) == _codes_of(a) == _codes_of(VectorIndex.from_units(DIM, *a.units(), quantise_from=0))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_rows, st.randoms(use_true_random=False))
def test_equal_to_the_exact_path_when_the_candidates_cover_every_row(rows, rnd):
    exact = VectorIndex(DIM, quantise_from=None)
    covering = VectorIndex(DIM, quantise_from=0, candidate_min=len(rows))
    for index in (exact, covering):
        index.add_many(range(len(rows)), np.array(rows, dtype=np.float64))
    seed = rnd.random()
    assert _answers(covering, random.Random(seed), len(rows)) == _answers(exact, random.Random(seed), len(rows))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_rows, st.randoms(use_true_random=False))
def test_results_are_exact_cosines_of_the_rows_returned_best_first(rows, rnd):
    index = _quantised()
    index.add_many(range(len(rows)), np.array(rows, dtype=np.float64))
    for q in _queries(rnd):
        if not q.any():
            assert index.search(q, limit=3) == []
            continue
        q64 = q / np.sqrt(np.sum(q**2))
        for limit in (1, 3):
            hits = index.search(q, limit=limit, tiebreak=_tiebreak)
            assert len(hits) <= limit and len({d for d, _ in hits}) == len(hits)
            for d, s in hits:
                want = float((index.vector(d).astype(np.float64) * q64).sum())
                assert s == pytest.approx(want, rel=1e-12, abs=1e-15) and s > 0
            keys = [(-s, _tiebreak(d)) for d, s in hits]
            assert keys == sorted(keys)


def test_a_tie_group_at_the_cut_is_taken_whole():
    # 30 copies of one row at the cut: the best by the caller's order wins on every replica,
    # wherever the copies sit in the matrix.
    rows = [[1.0, 0, 0, 0, 0, 0]] * 30 + [[0, 1.0, 0, 0, 0, 0]] * 5
    q = np.array([1.0, 0.5, 0, 0, 0, 0])
    want = sorted(range(30), key=_tiebreak)[:2]
    for seed in range(5):
        order = list(range(35))
        random.Random(seed).shuffle(order)
        index = _quantised()
        for d in order:
            index.add(d, np.array(rows[d]))
        assert [d for d, _ in index.search(q, limit=2, tiebreak=_tiebreak)] == want


def test_a_result_matches_the_exact_one_bit_for_bit():
    rng = np.random.default_rng(5)
    rows = rng.standard_normal((300, 16))
    exact = VectorIndex(16, quantise_from=None)
    quant = VectorIndex(16, quantise_from=0, candidate_min=1)
    for index in (exact, quant):
        index.add_many(range(300), rows)
    for q in rng.standard_normal((20, 16)):
        # Candidates: max(4 * limit, 1) = 40 of 300 rows; the top 3 is found and scored alike.
        got, want = quant.search(q, limit=3), exact.search(q, limit=3)
        assert got == want


def test_below_the_threshold_the_ranking_is_todays():
    rng = np.random.default_rng(1)
    rows = rng.integers(-3, 4, size=(200, 8)).astype(np.float64)
    default = VectorIndex(8)
    today = VectorIndex(8, quantise_from=None)
    for index in (default, today):
        index.add_many(range(200), rows)
    assert len(default) < QUANTISE_FROM
    for q in rng.integers(-3, 4, size=(10, 8)):
        for limit in (1, 5, None):
            assert default.search(q, limit=limit) == today.search(q, limit=limit)


def test_allowed_that_rejects_most_rows_grows_the_candidates_to_every_row():
    rng = np.random.default_rng(2)
    rows = rng.standard_normal((500, 8))
    exact = VectorIndex(8, quantise_from=None)
    quant = VectorIndex(8, quantise_from=0, candidate_min=1)
    for index in (exact, quant):
        index.add_many(range(500), rows)
    for q in rng.standard_normal((10, 8)):
        ok = {int(d) for d in rng.choice(500, 3, replace=False)}  # fewer than the limit
        assert quant.search(q, limit=5, allowed=ok.__contains__) == exact.search(q, limit=5, allowed=ok.__contains__)


def test_from_units_keeps_the_bits_and_does_not_copy(tmp_path):
    src = VectorIndex(8, quantise_from=0)
    rng = np.random.default_rng(3)
    src.add_many([5, 9, 2], rng.standard_normal((3, 8)))
    ids, units = src.units()
    assert ids.tolist() == [5, 9, 2] and not units.flags.writeable
    path = tmp_path / "units.f32"
    mm = np.memmap(path, dtype=np.float32, mode="w+", shape=units.shape)
    mm[:] = units
    mm.flush()
    ro = np.memmap(path, dtype=np.float32, mode="r", shape=units.shape)
    index = VectorIndex.from_units(8, ids, ro, quantise_from=0)
    assert np.shares_memory(index.units()[1], ro)
    for d in (5, 9, 2):
        assert index.vector(d).tobytes() == src.vector(d).tobytes()
    q = rng.standard_normal(8)
    assert index.search(q, limit=2) == src.search(q, limit=2)
    # A change copies the rows first: the mapped file is never written.
    before = path.read_bytes()
    index.remove(9)
    index.add(7, rng.standard_normal(8))
    assert path.read_bytes() == before and 9 not in index and len(index) == 3
    assert _codes_of(index) == _codes_of(VectorIndex.from_units(8, *index.units(), quantise_from=0))


def test_from_units_refuses_what_it_cannot_hold():
    units = np.zeros((2, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="float32 units of shape"):
        VectorIndex.from_units(4, [1, 2], units.astype(np.float64))
    with pytest.raises(ValueError, match="float32 units of shape"):
        VectorIndex.from_units(4, [1], units)
    with pytest.raises(ValueError, match="distinct"):
        VectorIndex.from_units(4, [1, 1], units)
    with pytest.raises(ValueError, match="non-finite"):
        VectorIndex.from_units(4, [1, 2], np.full((2, 4), np.nan, dtype=np.float32))
    with pytest.raises(ValueError, match="quantise_from"):
        VectorIndex(4, quantise_from=-1)
    with pytest.raises(ValueError, match="candidate_min"):
        VectorIndex(4, candidate_min=0)
    with pytest.raises(ValueError, match="candidate_factor"):
        VectorIndex(4, candidate_factor=True)


def test_codes_are_exact_and_use_the_int8_range():
    rows = np.array([[0.5, -0.25, 0, 0], [127 / 128, 0, 0, 0], [0.9999, -1e-30, 0, 0], [0, 0, 0, 0]], dtype=np.float32)
    codes, shifts = quantise_rows(rows)
    # The largest coordinate lands in 64..127: 0.5 * 2**8 = 128 is too big, 2**7 gives 64.
    assert codes.tolist()[0] == [64, -32, 0, 0] and shifts.tolist()[0] == 7
    assert codes.tolist()[1] == [127, 0, 0, 0] and shifts.tolist()[1] == 7
    assert codes.tolist()[2][0] == 64 and shifts.tolist()[2] == 6  # 0.9999 * 2**7 > 127
    assert codes.tolist()[3] == [0, 0, 0, 0]
    assert quantise_query(np.array([0.0, 0.3, -0.6])).tolist() == [0.0, 38.0, -77.0]


def test_sparse_and_dense_queries_score_alike():
    # A query with few non-zero coordinates reads only those codes; the integers are the same.
    rng = np.random.default_rng(4)
    index = VectorIndex(60, quantise_from=0)
    index.add_many(range(100), rng.standard_normal((100, 60)))
    assert index._codes is not None
    sparse = np.zeros(60)
    sparse[[3, 17]] = [0.5, -0.2]
    q = quantise_query(sparse / np.linalg.norm(sparse))
    got = index._codes.scores(q, 100)
    codes = index._codes.codes[:, :100].astype(np.int64)
    want = np.ldexp((q.astype(np.int64) @ codes).astype(np.float64), -index._codes.shifts[:100].astype(np.int32))
    assert got.tolist() == want.tolist()
    rows = np.array([5, 50, 7])
    assert index._codes.scores(q, 100, rows).tolist() == want[rows].tolist()
    dense = quantise_query(rng.standard_normal(60) / 8)
    assert np.count_nonzero(dense) > 50
    want = np.ldexp((dense.astype(np.int64) @ codes).astype(np.float64), -index._codes.shifts[:100].astype(np.int32))
    assert index._codes.scores(dense, 100).tolist() == want.tolist()
    assert index._codes.scores(dense, 100, rows).tolist() == want[rows].tolist()


def _oracle(rows: list, q: np.ndarray, limit: int, factor: int, least: int) -> list:
    """The quantised search recomputed apart: int64 code products, the cut, then the exact
    ranking of an index holding the candidates alone."""
    units = VectorIndex(DIM, quantise_from=None)
    units.add_many(range(len(rows)), np.array(rows, dtype=np.float64))
    ids, mat = units.units()
    codes, shifts = quantise_rows(mat)
    q64 = q / np.sqrt(np.sum(q**2))
    # exact rationals: integer * 2**-shift, compared as integer * 2**(max shift - shift)
    ints = codes.astype(np.int64) @ quantise_query(q64).astype(np.int64)
    keys = ints << (shifts.max() - shifts).astype(np.int64)
    total, depth = len(rows), max(factor * limit, least)
    while depth < total:
        cut = np.sort(keys)[::-1][depth - 1]
        picked = np.flatnonzero(keys >= cut)
        if len(picked) == total:
            break
        sub = VectorIndex.from_units(DIM, ids[picked], mat[picked], quantise_from=None)
        hits = sub.search(q, limit=limit, tiebreak=_tiebreak)
        if len(hits) == limit:
            return hits
        depth *= 4
    return units.search(q, limit=limit, tiebreak=_tiebreak)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_rows, st.randoms(use_true_random=False), st.integers(1, 3), st.integers(1, 8))
def test_the_result_is_the_exact_ranking_of_the_candidates(rows, rnd, factor, least):
    index = VectorIndex(DIM, quantise_from=0, candidate_factor=factor, candidate_min=least)
    index.add_many(range(len(rows)), np.array(rows, dtype=np.float64))
    for q in _queries(rnd):
        if not q.any():
            continue
        for limit in (1, 2, 4):
            assert index.search(q, limit=limit, tiebreak=_tiebreak) == _oracle(rows, q, limit, factor, least)
