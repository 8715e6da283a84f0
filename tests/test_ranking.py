"""Tests for the pure ranking core: node.memory.{tokens,bm25,vectors,fusion}."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memmesh.node.memory import bm25 as bm25_module
from memmesh.node.memory import vectors as vectors_module
from memmesh.node.memory.bm25 import InvertedIndex
from memmesh.node.memory.fusion import rank_candidates, rrf
from memmesh.node.memory.tokens import (
    STOPWORDS,
    autorecall_query_tokens,
    document_text,
    tokenize,
)
from memmesh.node.memory.vectors import VectorIndex

# --------------------------------------------------------------------------- tokens


def _reference_tokenize(text: str) -> list[str]:
    """Character-by-character statement of the rule, independent of the regex."""
    out, cur = [], []
    for c in text.lower():
        if c.isalnum():
            cur.append(c)
        else:
            out.append("".join(cur))
            cur = []
    out.append("".join(cur))
    return [t for t in out if len(t) >= 2]


def test_tokenize_punctuation():
    assert tokenize("Hello, world! It's an e-mail: foo.bar/baz_qux (ok?)") == [
        "hello",
        "world",
        "it",
        "an",
        "mail",
        "foo",
        "bar",
        "baz",
        "qux",
        "ok",
    ]


def test_tokenize_unicode():
    assert tokenize("Café MÜNCHEN naïve Straße ΑΘΗΝΑ Москва") == [
        "café",
        "münchen",
        "naïve",
        "straße",
        "αθηνα",
        "москва",
    ]
    # No spaces in the script: one token per run.
    assert tokenize("日本語テキスト") == ["日本語テキスト"]
    # Symbols and emoji separate; combining marks (NFD) separate too (no normalisation).
    assert tokenize("pizza🍕time") == ["pizza", "time"]
    assert tokenize("cafe\u0301 bar") == ["cafe", "bar"]


def test_tokenize_short_tokens_dropped():
    assert tokenize("a b cd e fg I am x") == ["cd", "fg", "am"]
    assert tokenize("") == []
    assert tokenize("  !! ?? a ") == []


def test_tokenize_digits_and_numerics():
    # "2" and "½" are single characters (dropped); superscripts and Arabic-Indic
    # digits are alphanumeric; "v1.2.3" splits at the dots.
    assert tokenize("version 2 of v1.2.3 costs 42€, 3rd ²³ ½ ٣٤") == [
        "version",
        "of",
        "v1",
        "costs",
        "42",
        "3rd",
        "²³",
        "٣٤",
    ]


@given(st.text(max_size=60))
@settings(max_examples=300)
def test_tokenize_matches_isalnum_rule(text):
    assert tokenize(text) == _reference_tokenize(text)


def test_document_text():
    assert document_text("k", "some value", ["t1", "t2"]) == "k some value t1 t2"
    assert document_text("k", "v", []) == "k v "
    assert tokenize(document_text("Pet", "cat named Tom", ["Animals"])) == ["pet", "cat", "named", "tom", "animals"]


def test_stopwords_are_tokens():
    assert "the" in STOPWORDS and "don" in STOPWORDS
    for w in STOPWORDS:
        assert tokenize(w) == [w], w


def test_autorecall_query_tokens():
    msgs = ["zero apples", "one", "two bananas", "three", "four", "the cherry and the cherry"]
    # Last 5 only ("zero apples" is out), stopwords removed, order and duplicates kept.
    assert autorecall_query_tokens(msgs) == ["one", "two", "bananas", "three", "four", "cherry", "cherry"]
    assert autorecall_query_tokens(msgs, last=1) == ["cherry", "cherry"]
    assert autorecall_query_tokens([]) == []
    # Messages are joined with a separator: no token spans two messages.
    assert autorecall_query_tokens(["foo", "bar"]) == ["foo", "bar"]
    with pytest.raises(ValueError):
        autorecall_query_tokens(msgs, last=0)


# ----------------------------------------------------------------------------- BM25


def _index(docs: dict[int, str]) -> InvertedIndex:
    ix = InvertedIndex()
    for doc_id, text in docs.items():
        ix.add(doc_id, tokenize(text))
    return ix


def test_bm25_hand_computed():
    ix = _index({10: "cat sat mat", 11: "cat cat dog", 12: "bird flew"})
    # N = 3, document lengths 3, 3, 2 -> avgdl = 8/3.
    assert len(ix) == 3 and ix.avgdl == pytest.approx(8 / 3)
    # idf(cat): df = 2 -> ln(1 + (3 - 2 + 0.5) / (2 + 0.5)) = ln(1 + 1.5/2.5) = ln(1.6)
    #         = 0.470003629245736
    # idf(dog): df = 1 -> ln(1 + 2.5/1.5) = ln(8/3) = 0.980829253011726
    assert ix.idf("cat") == pytest.approx(0.470003629245736, abs=1e-15)
    assert ix.idf("dog") == pytest.approx(0.980829253011726, abs=1e-15)
    # Length norm for dl = 3: k1 * (1 - b + b * dl/avgdl) = 1.5 * (0.25 + 0.75 * 9/8)
    #                                                       = 1.5 * 1.09375 = 1.640625
    # doc 10, "cat" tf = 1: tfc = 1 / (1 + 1.640625) = 0.378698224852071
    #         score = 0.470003629245736 * 0.378698224852071 = 0.177989540069391
    # doc 11, "cat" tf = 2: tfc = 2 / (2 + 1.640625) = 0.549356223175966
    #         score = 0.470003629245736 * 0.549356223175966 = 0.258199418641434
    # doc 12 has no "cat": dropped.
    res = ix.search(["cat"], limit=None)
    assert [d for d, _ in res] == [11, 10]
    assert res[0][1] == pytest.approx(0.258199418641434, rel=1e-12)
    assert res[1][1] == pytest.approx(0.177989540069391, rel=1e-12)
    # "cat dog": doc 11 adds idf(dog) * 1/(1 + 1.640625) = 0.980829253011726 * 0.378698224852071
    #          = 0.371438297000... -> 0.258199418641434 + 0.371438296998524 = 0.629637715639958
    res = ix.search(["cat", "dog"], limit=None)
    assert [d for d, _ in res] == [11, 10]
    assert res[0][1] == pytest.approx(0.629637715639958, rel=1e-12)
    # A repeated query token counts once per occurrence (as bm25s does).
    twice = dict(ix.search(["dog", "dog"], limit=None))
    once = dict(ix.search(["dog"], limit=None))
    assert twice[11] == pytest.approx(2 * once[11], rel=1e-15)
    # Unknown tokens are ignored; a query of only unknown tokens matches nothing.
    assert ix.search(["cat", "zebra"], limit=None) == ix.search(["cat"], limit=None)
    assert ix.search(["zebra"], limit=None) == []
    assert ix.search([], limit=None) == []


def test_bm25_doc_matching_no_token_dropped():
    ix = _index({1: "alpha beta", 2: "gamma delta", 3: "alpha alpha"})
    assert sorted(d for d, _ in ix.search(["alpha"], limit=None)) == [1, 3]
    assert all(score > 0 for _, score in ix.search(["alpha", "gamma"], limit=None))
    assert 2 not in dict(ix.search(["alpha"], limit=10))


def test_bm25_limit_and_validation():
    ix = _index({i: f"word w{i % 3}" for i in range(10)})
    assert len(ix.search(["word"], limit=3)) == 3
    assert ix.search(["word"], limit=0) == []
    with pytest.raises(ValueError):
        ix.search(["word"], limit=-1)
    with pytest.raises(ValueError):
        ix.add(1, ["dup"])
    with pytest.raises(KeyError):
        ix.remove(999)
    with pytest.raises(TypeError):
        ix.add(100, "not a token list")
    with pytest.raises(TypeError):
        ix.search("word", limit=1)
    assert 100 not in ix and len(ix) == 10


def test_bm25_allowed_filter():
    ix = _index({i: "common " + ("rare " * (i % 4)) + f"x{i % 7}" for i in range(600)})
    full = ix.search(["common", "rare"], limit=None)
    allowed = lambda d: d % 5 == 0  # noqa: E731
    expected = [(d, s) for d, s in full if allowed(d)]
    assert ix.search(["common", "rare"], limit=None, allowed=allowed) == expected
    # A small limit over many candidates uses prefix selection: same answer.
    assert ix.search(["common", "rare"], limit=7, allowed=allowed) == expected[:7]
    assert ix.search(["common"], limit=5, allowed=lambda d: False) == []
    # allowed is consulted lazily: only as far down the ranking as needed.
    calls = []
    ix.search(["common", "rare"], limit=3, allowed=lambda d: calls.append(d) or True)
    assert len(calls) < 300


def test_bm25_ties_deterministic():
    # Identical documents tie exactly; the caller's key decides, whatever the
    # insertion order and whatever the order of the query tokens.
    texts = {7: "blue sky today", 3: "blue sky today", 5: "blue sky today", 9: "blue", 1: "sky blue today"}
    a = _index(texts)
    b = _index(dict(reversed(list(texts.items()))))
    for q in (["blue", "sky"], ["sky", "blue"]):
        ra = a.search(q, limit=None)
        rb = b.search(q, limit=None)
        assert ra == rb
        # 1, 3, 5, 7 have the same tokens and length: one tie group, ordered by doc id.
        assert [d for d, _ in ra][:4] == [1, 3, 5, 7]
    assert a.search(["blue", "sky"], limit=None) == a.search(["sky", "blue"], limit=None)
    key = {7: "a", 5: "b", 3: "c", 1: "d"}
    rk = a.search(["blue", "sky"], limit=2, tiebreak=lambda d: key.get(d, "z"))
    assert [d for d, _ in rk] == [7, 5]


@given(
    st.lists(st.lists(st.sampled_from(["ant", "bee", "cat", "dog", "eel", "fox"]), max_size=12), min_size=1, max_size=40),
    st.permutations(["ant", "bee", "cat", "dog", "eel", "fox"]),
)
@settings(max_examples=100)
def test_bm25_query_token_order_irrelevant(docs, perm):
    # Float addition is not associative; scores are summed in a canonical token order,
    # so any permutation of the query gives bit-identical scores.
    ix = InvertedIndex()
    for i, toks in enumerate(docs):
        ix.add(i, toks)
    base = ix.search(["ant", "bee", "cat", "dog", "eel", "fox"], limit=None)
    assert ix.search(list(perm), limit=None) == base
    assert ix.search(list(perm) + list(perm[:2]), limit=None) == ix.search(
        ["ant", "bee", "cat", "dog", "eel", "fox"] + list(perm[:2]), limit=None
    )


def test_bm25_order_canonical_regression():
    # A case where summing in query order would differ in the last bit.
    rnd = random.Random(5)
    words = [f"t{i}" for i in range(12)]
    ix = InvertedIndex()
    for i in range(300):
        ix.add(i, rnd.choices(words, k=rnd.randint(1, 9)))
    q = words[:6]
    base = ix.search(q, limit=None)
    for _ in range(30):
        rnd.shuffle(q)
        assert ix.search(q, limit=None) == base


_VOCAB = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen"]
_doc_tokens = st.lists(st.sampled_from(_VOCAB), min_size=0, max_size=8)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 30), _doc_tokens),
        st.tuples(st.just("remove"), st.integers(0, 30), st.just([])),
        st.tuples(st.just("compact"), st.just(0), st.just([])),
    ),
    max_size=60,
)
_queries = [["ant"], ["bee", "cat"], ["dog", "dog", "eel"], ["fox", "gnu", "hen", "ant"], ["zzz"], _VOCAB]


@given(_ops, st.randoms(use_true_random=False))
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_bm25_incremental_equals_rebuild(ops, rnd):
    ix = InvertedIndex()
    live: dict[int, list[str]] = {}
    for op, doc_id, tokens in ops:
        if op == "add" and doc_id not in live:
            ix.add(doc_id, tokens)
            live[doc_id] = tokens
        elif op == "remove" and doc_id in live:
            ix.remove(doc_id)
            del live[doc_id]
        elif op == "compact":
            ix.compact()
    fresh = InvertedIndex()
    items = list(live.items())
    rnd.shuffle(items)
    for doc_id, tokens in items:
        fresh.add(doc_id, tokens)
    assert len(ix) == len(fresh) == len(live)
    assert ix.avgdl == fresh.avgdl
    for token in _VOCAB:
        assert ix.df(token) == fresh.df(token)
    for q in _queries:
        # Bit-identical scores and identical order.
        assert ix.search(q, limit=None) == fresh.search(q, limit=None)
        assert ix.search(q, limit=3) == fresh.search(q, limit=3)


def test_bm25_automatic_compaction_keeps_results():
    rnd = random.Random(7)
    words = [f"w{i}" for i in range(50)]
    ix = InvertedIndex()
    live = {}
    for next_id in range(3000):
        toks = rnd.choices(words, k=rnd.randint(1, 6))
        ix.add(next_id, toks)
        live[next_id] = toks
        if len(live) > 200:
            victim = rnd.choice(sorted(live))
            ix.remove(victim)
            del live[victim]
    # Many more removals than live rows: compaction must have run.
    assert ix._n_slots < 2 * bm25_module._COMPACT_MIN_DEAD + len(live)
    fresh = InvertedIndex()
    for d, t in live.items():
        fresh.add(d, t)
    for q in (["w1"], ["w2", "w3", "w4"], words[:10]):
        assert ix.search(q, limit=None) == fresh.search(q, limit=None)


def test_bm25_empty_documents_count_in_n():
    ix = InvertedIndex()
    ix.add(1, [])
    ix.add(2, ["solo"])
    # N = 2 (the empty row is current), df = 1, avgdl = 1/2.
    assert len(ix) == 2 and ix.avgdl == 0.5
    assert ix.idf("solo") == pytest.approx(math.log(1 + 1.5 / 1.5))
    assert [d for d, _ in ix.search(["solo"], limit=None)] == [2]
    only_empty = InvertedIndex()
    only_empty.add(1, [])
    assert only_empty.search(["x"], limit=None) == []


# -------------------------------------------------------------------------- vectors


def _brute(vectors: dict[int, np.ndarray], q: np.ndarray) -> dict[int, float]:
    qn = q.astype(np.float64)
    qn = qn / np.linalg.norm(qn)
    out = {}
    for d, v in vectors.items():
        v = v.astype(np.float64)
        n = np.linalg.norm(v)
        if n == 0:
            continue
        s = float(np.dot(v / n, qn))
        out[d] = s
    return out


_vec = st.lists(st.floats(-10, 10, allow_nan=False, width=32), min_size=6, max_size=6).map(
    lambda xs: np.array(xs, dtype=np.float32)
)


@given(st.dictionaries(st.integers(0, 10_000), _vec, max_size=40), _vec)
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_vectors_cosine_matches_bruteforce(vectors, q):
    vi = VectorIndex(6)
    for d, v in vectors.items():
        vi.add(d, v)
    res = vi.search(q, limit=None)
    if not np.any(q):
        assert res == []
        return
    brute = _brute(vectors, q)
    got = dict(res)
    # Everything returned is positive and close to the float64 brute force.
    for d, s in res:
        assert s > 0
        assert s == pytest.approx(brute[d], abs=1e-5)
    # Everything clearly positive is returned; nothing clearly non-positive is.
    for d, s in brute.items():
        if s > 1e-5:
            assert d in got
        if s < -1e-5:
            assert d not in got
    # Best first.
    assert [s for _, s in res] == sorted((s for _, s in res), reverse=True)
    # limit is a prefix of the full ranking.
    assert vi.search(q, limit=3) == res[:3]


def test_vectors_non_positive_and_zero_dropped():
    vi = VectorIndex(3)
    vi.add(1, np.array([1, 0, 0], dtype=np.float32))
    vi.add(2, np.array([-1, 0, 0], dtype=np.float32))
    vi.add(3, np.array([0, 1, 0], dtype=np.float32))  # orthogonal: cosine 0
    vi.add(4, np.zeros(3, dtype=np.float32))  # zero vector: never matches
    vi.add(5, np.array([3, 4, 0], dtype=np.float32))
    res = vi.search(np.array([2, 0, 0], dtype=np.float32), limit=None)
    assert [d for d, _ in res] == [1, 5]
    assert res[0][1] == pytest.approx(1.0) and res[1][1] == pytest.approx(0.6)
    assert vi.search(np.zeros(3, dtype=np.float32), limit=None) == []
    with pytest.raises(ValueError):
        vi.add(6, np.zeros(4, dtype=np.float32))
    with pytest.raises(ValueError):
        vi.add(6, np.array([np.nan, 0, 0], dtype=np.float32))
    with pytest.raises(ValueError):
        vi.add(1, np.ones(3, dtype=np.float32))
    with pytest.raises(ValueError):
        vi.search(np.ones(2, dtype=np.float32), limit=1)


def test_vectors_removal_and_growth():
    rng = np.random.default_rng(3)
    vecs = {i: rng.standard_normal(8).astype(np.float32) for i in range(100)}
    vi = VectorIndex(8)
    for d, v in vecs.items():
        vi.add(d, v)
    assert len(vi) == 100 and vi.capacity >= 100
    cap = vi.capacity
    for d in range(0, 100, 3):
        vi.remove(d)
        del vecs[d]
    with pytest.raises(KeyError):
        vi.remove(0)
    assert len(vi) == len(vecs) and vi.capacity == cap
    fresh = VectorIndex(8)
    for d, v in vecs.items():
        fresh.add(d, v)
    for _ in range(20):
        q = rng.standard_normal(8).astype(np.float32)
        assert vi.search(q, limit=None) == fresh.search(q, limit=None)
        assert set(dict(vi.search(q, limit=None))) == {d for d, s in _brute(vecs, q).items() if s > 0}
    # Removed rows are gone, moved rows keep their vectors.
    for d in vecs:
        np.testing.assert_allclose(vi.vector(d), vecs[d] / np.linalg.norm(vecs[d]), rtol=1e-6, atol=1e-7)


def test_vectors_order_independent_and_prefix_selection():
    # Same vectors inserted in different orders (so at different matrix rows) give
    # bit-identical results; a small limit over many candidates equals the full list.
    # (A raw float32 BLAS product differs in the last bits for rows in the tail block
    # when n is not a multiple of the kernel's block size: 3007 rows, dim 384.)
    rng = np.random.default_rng(11)
    n, dim = 3007, 384
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    vecs[100] = vecs[200]  # an exact tie
    a, b = VectorIndex(dim), VectorIndex(dim)
    for i in range(n):
        a.add(i, vecs[i])
    for i in rng.permutation(n).tolist():
        b.add(i, vecs[i])
    for j in range(25):
        q = vecs[100] if j == 0 else rng.standard_normal(dim).astype(np.float32)
        full = a.search(q, limit=None)
        assert full == b.search(q, limit=None)
        assert a.search(q, limit=10) == b.search(q, limit=10) == full[:10]
        allowed = lambda d: d % 7 == 0  # noqa: E731
        assert a.search(q, limit=5, allowed=allowed) == [(d, s) for d, s in full if allowed(d)][:5]
    top = a.search(vecs[100], limit=2)
    assert [d for d, _ in top] == [100, 200] and top[0][1] == top[1][1]
    top = a.search(vecs[100], limit=2, tiebreak=lambda d: -d)
    assert [d for d, _ in top] == [200, 100]


# --------------------------------------------------------------------------- fusion


def test_rrf_hand_computed():
    # List 1: a=1, b=2, c=3.  List 2: c=1, a=2, d=3.  k = 60.
    # a: 1/61 + 1/62 = 0.0163934426 + 0.0161290323 = 0.0325224749
    # c: 1/63 + 1/61 = 0.0158730159 + 0.0163934426 = 0.0322664585
    # b: 1/62        = 0.0161290323
    # d: 1/63        = 0.0158730159
    a, b, c, d = 1, 2, 3, 4
    res = rrf([[a, b, c], [c, a, d]])
    assert [x for x, _ in res] == [a, c, b, d]
    assert res[0][1] == pytest.approx(0.0325224749, abs=1e-10)
    assert res[1][1] == pytest.approx(0.0322664585, abs=1e-10)
    assert res[2][1] == pytest.approx(1 / 62)
    assert res[3][1] == pytest.approx(1 / 63)
    assert rrf([[a, b, c], [c, a, d]], limit=2) == res[:2]
    assert rrf([[5, 6]], k=0) == [(5, 1.0), (6, 0.5)]
    assert rrf([]) == [] and rrf([[], []]) == []


def test_rrf_ties_and_validation():
    # First in one list only vs first in the other only: an exact tie.
    res = rrf([[8], [2]])
    assert res == [(2, 1 / 61), (8, 1 / 61)]
    assert [x for x, _ in rrf([[8], [2]], tiebreak=lambda d: -d)] == [8, 2]
    # The order of the lists does not change the sums or the ranking.
    assert rrf([[1, 2, 3], [3, 2, 1]]) == rrf([[3, 2, 1], [1, 2, 3]])
    # Same multiset of ranks -> bit-identical score (terms are summed best rank first),
    # so these three are a true tie, ordered by the key.
    res = rrf([[1, 2, 3], [2, 3, 1], [3, 1, 2]])
    assert [x for x, _ in res] == [1, 2, 3]
    assert res[0][1] == res[1][1] == res[2][1] == (1 / 61 + 1 / 62) + 1 / 63
    assert [x for x, _ in rrf([[1, 2, 3], [2, 3, 1], [3, 1, 2]], tiebreak=lambda d: -d)] == [3, 2, 1]
    with pytest.raises(ValueError):
        rrf([[1, 1]])
    with pytest.raises(ValueError):
        rrf([[1]], k=-1)


@given(
    st.lists(st.lists(st.integers(0, 50), unique=True, max_size=30), max_size=4),
    st.integers(0, 100),
)
def test_rrf_matches_definition(lists, k):
    ranks: dict[int, list[int]] = {}
    for lst in lists:
        for rank, d in enumerate(lst, start=1):
            ranks.setdefault(d, []).append(rank)
    expected = {}
    for d, rs in ranks.items():
        total = 0.0
        for r in sorted(rs):  # best rank first
            total += 1.0 / (k + r)
        expected[d] = total
    want = sorted(expected.items(), key=lambda p: (-p[1], p[0]))
    assert rrf(lists, k=k) == want


def test_rank_candidates_prefix_grows():
    # 2000 distinct scores, 1 in 50 allowed, limit 5: the first prefix (64 best) holds
    # about one allowed id, so the walk must continue into later prefixes.
    ids = list(range(2000))
    scores = [1.0 / (i + 1) for i in ids]
    got = rank_candidates(ids, scores, limit=5, allowed=lambda d: d % 50 == 49)
    assert [d for d, _ in got] == [49, 99, 149, 199, 249]
    got = rank_candidates(ids, scores, limit=5, allowed=lambda d: d == 1999)
    assert got == [(1999, 1.0 / 2000)]


@given(
    st.lists(st.tuples(st.integers(0, 5000), st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.25])), max_size=600, unique_by=lambda p: p[0]),
    st.one_of(st.none(), st.integers(0, 40)),
    st.integers(1, 4),
)
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
def test_rank_candidates_matches_sort(pairs, limit, mod):
    ids = [p[0] for p in pairs]
    scores = [p[1] for p in pairs]
    key = lambda d: (d * 7919) % 1009  # noqa: E731 - a non-trivial tiebreak
    allowed = lambda d: d % mod == 0  # noqa: E731
    want = sorted(((d, s) for d, s in pairs if allowed(d)), key=lambda p: (-p[1], key(p[0]), p[0]))
    # The key above can collide; make it total for the comparison.
    tb = lambda d: (key(d), d)  # noqa: E731
    want = want if limit is None else want[:limit]
    assert rank_candidates(ids, scores, limit=limit, allowed=allowed, tiebreak=tb) == want
    plain = sorted(pairs, key=lambda p: (-p[1], p[0]))
    assert rank_candidates(ids, scores, limit=limit) == (plain if limit is None else plain[:limit])


# ----------------------------------------------------------------------- bulk loads
_bulk_vocab = _VOCAB + [f"w{i}" for i in range(40)]
_bulk_docs = st.lists(
    st.tuples(st.integers(0, 200), st.lists(st.sampled_from(_bulk_vocab), max_size=12)),
    max_size=60,
    unique_by=lambda d: d[0],
)


def _bm25_state(ix: InvertedIndex, queries) -> list:
    out: list = [len(ix), ix.avgdl, [ix.df(t) for t in _bulk_vocab + ["zzz"]]]
    for q in queries:
        out.append(ix.search(q, limit=None))
        out.append(ix.search(q, limit=3))
        ids, scores = ix.scores(q)
        order = np.argsort(ids)
        out.append((ids[order].tolist(), scores[order].tolist()))
    return out


@given(_bulk_docs, st.integers(0, 60), st.sampled_from([1, 3, 4096]), st.randoms(use_true_random=False))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_bm25_add_many_equals_incremental(docs, split, merge_min, rnd):
    # The same corpus built one document at a time and in bulk (into an empty index, and
    # into one holding the first documents) answers every query identically: same ids,
    # bit-identical scores. A small _MERGE_MIN makes the incremental index rebuild its main
    # postings often, so main part, tail and both mixed are all compared.
    queries = [["ant"], ["bee", "cat"], ["dog", "dog", "eel"], ["w1", "w2", "ant"], ["zzz"], _bulk_vocab,
               rnd.sample(_bulk_vocab, 5)]
    saved = bm25_module._MERGE_MIN
    bm25_module._MERGE_MIN = merge_min
    try:
        one = InvertedIndex()
        for doc_id, tokens in docs:
            one.add(doc_id, tokens)
        bulk = InvertedIndex()
        bulk.add_many(docs)
        mixed = InvertedIndex()
        for doc_id, tokens in docs[:split]:
            mixed.add(doc_id, tokens)
        mixed.add_many(iter(docs[split:]))  # any iterable, tokens as tuples too
        expected = _bm25_state(one, queries)
        assert _bm25_state(bulk, queries) == expected
        assert _bm25_state(mixed, queries) == expected
        # Both keep working incrementally: remove some, add more, compact.
        extra = [(1000 + i, rnd.sample(_bulk_vocab, rnd.randint(0, 5))) for i in range(5)]
        victims = [d for d, _ in docs if rnd.random() < 0.3]
        for ix in (one, bulk, mixed):
            for d in victims:
                ix.remove(d)
            for d, t in extra:
                ix.add(d, t)
        expected = _bm25_state(one, queries)
        assert _bm25_state(bulk, queries) == expected
        assert _bm25_state(mixed, queries) == expected
        for ix in (one, bulk, mixed):
            ix.compact()
            assert _bm25_state(ix, queries) == expected
    finally:
        bm25_module._MERGE_MIN = saved


def test_bm25_add_many_large_tf_and_validation():
    # tf beyond 255 and 65535 changes the stored tf type, never the scores.
    docs = [(1, ["big"] * 70_000 + ["x"]), (2, ["big"] * 300), (3, ["big", "x"]), (4, [])]
    one, bulk = InvertedIndex(), InvertedIndex()
    for d, t in docs:
        one.add(d, t)
    bulk.add_many(docs)
    for q in (["big"], ["x"], ["big", "x"]):
        assert bulk.search(q, limit=None) == one.search(q, limit=None)
    one.compact()
    assert bulk.search(["big", "x"], limit=None) == one.search(["big", "x"], limit=None)

    ix = InvertedIndex()
    ix.add(1, ["alpha"])
    before = _bm25_state(ix, [["alpha"], ["beta"]])
    for bad, error in [
        ([(2, ["beta"]), (2, ["gamma"])], ValueError),  # the same id twice
        ([(2, ["beta"]), (1, ["gamma"])], ValueError),  # already indexed
        ([(2, ["beta"]), (3, "gamma")], TypeError),  # a string, not a token list
        ([(2, ["beta"]), (3, ["gamma", 5])], TypeError),  # a token that is not a string
        ([(2, ["beta"]), (3, [["unhashable"]])], TypeError),
        ([(2, ["beta"]), ("3", ["gamma"])], TypeError),  # a doc id that is not an int
        ([(True, ["beta"])], TypeError),
    ]:
        with pytest.raises(error):
            ix.add_many(bad)
        # Refused as a whole: nothing added, not even to the vocabulary.
        assert _bm25_state(ix, [["alpha"], ["beta"]]) == before
        assert ix.df("beta") == 0 and "beta" not in ix._vocab and 2 not in ix
    ix.add_many([])
    assert _bm25_state(ix, [["alpha"], ["beta"]]) == before


def test_bm25_postings_memory_is_flat():
    # No array objects per token: the main postings are three shared arrays.
    rnd = random.Random(3)
    docs = [(i, [f"u{i}"] + rnd.choices(_VOCAB, k=5)) for i in range(5000)]
    ix = InvertedIndex()
    ix.add_many(docs)
    assert ix._tail == {} and len(ix._offs) == len(ix._vocab) + 1
    assert len(ix._c_slot) == sum(len(set(t)) for _, t in docs) and ix._c_tf.dtype == np.uint8
    # Incremental adds go to the tail until it is large enough to be merged.
    for i in range(5000, 5100):
        ix.add(i, ["tail", f"u{i}"])
    assert len(ix._tail) == 101 and ix.nbytes() > 0
    saved = bm25_module._MERGE_MIN
    try:
        bm25_module._MERGE_MIN = 10
        for i in range(5100, 5100 + 4000):  # the main part has ~27k postings: merged on the way
            ix.add(i, [f"u{i}", "more"])
    finally:
        bm25_module._MERGE_MIN = saved
    assert len(ix._tail) < 1500 and len(ix._c_slot) > 30_000  # merged once
    fresh = InvertedIndex()
    for d, t in docs + [(i, ["tail", f"u{i}"]) for i in range(5000, 5100)] + [
        (i, [f"u{i}", "more"]) for i in range(5100, 9100)
    ]:
        fresh.add(d, t)
    for q in (["tail"], ["more", "ant"], ["u5050", "u9000", "u7000", "bee"]):
        assert ix.search(q, limit=None) == fresh.search(q, limit=None)


_vec32 = st.lists(
    st.one_of(st.floats(-10, 10, allow_nan=False, width=32), st.floats(-2.0**100, 2.0**100, allow_nan=False, width=32),
              st.sampled_from([0.0, 1e-30, -1e-38, 3e38, 1.0])),
    min_size=5, max_size=5,
)


@given(st.lists(_vec32, max_size=40), st.integers(0, 40), st.lists(_vec32, min_size=1, max_size=3))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_vectors_add_many_equals_add(rows, split, queries):
    mat = np.array(rows, dtype=np.float32).reshape(len(rows), 5)
    ids = [3 * i + 1 for i in range(len(rows))]
    one, bulk, mixed, listed = VectorIndex(5), VectorIndex(5), VectorIndex(5), VectorIndex(5)
    for d, v in zip(ids, mat):
        one.add(d, v)
    bulk.add_many(ids, mat)
    for d, v in zip(ids[:split], mat[:split]):
        mixed.add(d, v)
    mixed.add_many(ids[split:], mat[split:])
    listed.add_many(iter(ids), list(mat))  # a sequence of vectors works too
    # The stored (normalised, float32) rows are bit-identical, so every search is.
    for ix in (bulk, mixed, listed):
        assert len(ix) == len(one)
        for d in ids:
            assert ix.vector(d).tobytes() == one.vector(d).tobytes()
        for q in queries:
            qv = np.array(q, dtype=np.float32)
            assert ix.search(qv, limit=None) == one.search(qv, limit=None)
            assert ix.search(qv, limit=2) == one.search(qv, limit=2)
    assert bulk.capacity == max(16, len(rows))  # sized exactly (never below the initial 16)


@given(st.lists(st.lists(st.floats(-1e150, 1e150, allow_nan=False), min_size=1, max_size=70), min_size=1, max_size=8))
@settings(max_examples=150, deadline=None)
def test_vectors_bulk_norm_is_fsum_exactly(rows):
    # The vectorised sum of squares equals math.fsum wherever it claims to; rows it cannot
    # verify go through add's own path, so float64 input is bit-identical too.
    width = max(map(len, rows))
    mat = np.array([r + [0.0] * (width - len(r)) for r in rows], dtype=np.float64)
    sq = mat * mat
    sums, ok = vectors_module._fsum_rows(sq)
    for i in np.flatnonzero(ok).tolist():
        assert sums[i] == math.fsum(sq[i].tolist())
    one, bulk = VectorIndex(width), VectorIndex(width)
    for i, v in enumerate(mat):
        one.add(i, v)
    bulk.add_many(range(len(mat)), mat)
    assert bulk._mat[: len(mat)].tobytes() == one._mat[: len(mat)].tobytes()


def test_vectors_bulk_norm_cases_and_validation():
    # Rows whose rounding is hard: a tiny term after a large one, exact midpoints, zeros,
    # subnormal sums, many equal terms, integers; all equal to add's result.
    tricky = np.zeros((8, 64), dtype=np.float64)
    tricky[0, 0], tricky[0, 1] = 1.0, 2.0**-27  # square 2**-54: half an ulp of 1
    tricky[1, :3] = [1.0, 2.0**-27, 2.0**-40]  # just above the midpoint
    tricky[2, :] = 0.1
    tricky[3, 0] = 1e-160  # sum in the subnormal range: add's path
    tricky[5, :] = np.arange(64)
    tricky[6, ::2] = 3.0
    tricky[7, 0], tricky[7, 63] = 2.0**-27, 1.0
    sums, ok = vectors_module._fsum_rows(tricky * tricky)
    for i in np.flatnonzero(ok).tolist():
        assert sums[i] == math.fsum((tricky[i] * tricky[i]).tolist())
    assert not ok[3] and not ok[4]  # subnormal and zero rows are left to math.fsum
    one, bulk = VectorIndex(64), VectorIndex(64)
    for i, v in enumerate(tricky):
        one.add(i, v)
    bulk.add_many(range(8), tricky)
    assert bulk._mat[:8].tobytes() == one._mat[:8].tobytes()
    ints = np.arange(128).reshape(2, 64)
    a, b = VectorIndex(64), VectorIndex(64)
    a.add(0, ints[0])
    a.add(1, ints[1])
    b.add_many([0, 1], ints)
    assert b._mat[:2].tobytes() == a._mat[:2].tobytes()

    vi = VectorIndex(3)
    vi.add(1, np.array([1, 0, 0], dtype=np.float32))
    for ids, mat, error in [
        ([2, 2], np.eye(3)[:2], ValueError),  # the same id twice
        ([2, 1], np.eye(3)[:2], ValueError),  # already indexed
        ([2], np.eye(4)[:1], ValueError),  # wrong length
        ([2, 3], np.eye(3)[:1], ValueError),  # ids and rows differ in number
        ([2, 3], np.array([[1, 0, 0], [np.nan, 0, 0]]), ValueError),  # not finite (in a later row)
        ([2], np.array([["a", "b", "c"]]), TypeError),
        (["2"], np.eye(3)[:1], TypeError),
        ([2], np.ones(3), ValueError),  # a vector, not a matrix
    ]:
        with pytest.raises(error):
            vi.add_many(ids, mat)
        assert len(vi) == 1 and 2 not in vi and 3 not in vi
    vi.add_many([], np.zeros((0, 3)))
    assert len(vi) == 1


def test_vectors_grow_by_half():
    vi = VectorIndex(2)
    caps = []
    for i in range(200):
        vi.add(i, np.array([1.0, float(i)]))
        caps.append(vi.capacity)
    assert sorted(set(caps)) == [16, 24, 36, 54, 81, 121, 181, 271]
    vi.add_many(range(200, 400), np.ones((200, 2)))
    assert vi.capacity == 400 and len(vi) == 400
    vi.add_many(range(400, 410), np.ones((10, 2)))
    assert vi.capacity == 410


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_tokenize_is_the_alnum_runs_of_two_or_more(text):
    import re as _re

    runs = [t for t in _re.findall(r"[^\W_]+", text.lower()) if len(t) >= 2]
    assert tokenize(text) == runs


# ------------------------------------------------------- subsets and masks (memory views)
_subset_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 30), _doc_tokens),  # to the index
        st.tuples(st.just("join"), st.integers(0, 30), st.just([])),  # the subset
        st.tuples(st.just("leave"), st.integers(0, 30), st.just([])),
        st.tuples(st.just("drop"), st.integers(0, 30), st.just([])),  # from the index (not a member)
        st.tuples(st.just("join_many"), st.integers(0, 30), st.just([])),
        st.tuples(st.just("compact"), st.just(0), st.just([])),
    ),
    max_size=60,
)


@given(_subset_ops, st.randoms(use_true_random=False))
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_a_subset_scores_as_an_index_of_its_documents_alone(ops, rnd):
    """A view ranks current rows with the current rows' statistics over postings shared with
    the index of every row: the subset must answer bit for bit as a separate index would."""
    ix = InvertedIndex()
    sub = bm25_module.Subset(ix)
    docs: dict[int, list[str]] = {}
    members: set[int] = set()
    for op, doc_id, tokens in ops:
        if op == "add" and doc_id not in docs:
            ix.add(doc_id, tokens)
            docs[doc_id] = tokens
        elif op == "join" and doc_id in docs and doc_id not in members:
            sub.add(doc_id)
            members.add(doc_id)
        elif op == "join_many":
            new = [d for d in docs if d not in members][: doc_id % 5 + 1]
            sub.add_many(new)
            members.update(new)
        elif op == "leave" and doc_id in members:
            sub.remove(doc_id)
            members.discard(doc_id)
        elif op == "drop" and doc_id in docs:
            if doc_id in members:
                with pytest.raises(ValueError, match="in a subset"):
                    ix.remove(doc_id)
            else:
                ix.remove(doc_id)
                del docs[doc_id]
        elif op == "compact":
            ix.compact()
    alone = InvertedIndex()
    items = [(d, docs[d]) for d in members]
    rnd.shuffle(items)
    for doc_id, tokens in items:
        alone.add(doc_id, tokens)
    assert len(sub) == len(alone) and sub.avgdl == alone.avgdl
    assert all(sub.df(t) == alone.df(t) for t in _VOCAB)
    assert all((d in sub) == (d in members) for d in range(31))
    for q in _queries:
        assert sub.search(q, limit=None) == alone.search(q, limit=None)
        assert sub.search(q, limit=3) == alone.search(q, limit=3)
        mask = np.array([d % 2 == 0 for d in range(31)])
        assert sub.search(q, limit=None, mask=mask) == alone.search(q, limit=None, allowed=lambda d: d % 2 == 0)
        # The index itself still answers over every document, with its own statistics.
        whole = InvertedIndex()
        for doc_id, tokens in docs.items():
            whole.add(doc_id, tokens)
        assert ix.search(q, limit=None) == whole.search(q, limit=None)


def test_a_subset_is_scored_only_by_its_index():
    a, b = InvertedIndex(), InvertedIndex()
    a.add(0, ["x"])
    b.add(0, ["x"])
    sub = bm25_module.Subset(a)
    sub.add(0)
    with pytest.raises(ValueError, match="only by the index"):
        b.search(["x"], limit=None, subset=sub)
    with pytest.raises(ValueError, match="already in the subset"):
        sub.add(0)
    with pytest.raises(KeyError):
        sub.remove(5)


@given(st.lists(st.lists(st.integers(-3, 3), min_size=4, max_size=4), min_size=1, max_size=120),
       st.lists(st.integers(-3, 3), min_size=4, max_size=4), st.floats(0.0, 1.0),
       st.sampled_from([None, 1, 5, 100]), st.randoms(use_true_random=False))
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
def test_vector_search_with_a_mask_is_search_with_that_filter(rows, q, share, limit, rnd):
    """Both paths of a mask (a selective one multiplies only the allowed rows) give exactly
    what the lazy filter gives, and moving rows between indexes (add_unit) keeps them."""
    if not any(q):
        q = [1, 0, 0, 0]
    ix = VectorIndex(4)
    ids = rnd.sample(range(1000), len(rows))
    for doc, v in zip(ids, rows):
        ix.add(doc, np.array(v, dtype=np.float64))
    mask = np.zeros(1000, dtype=bool)
    mask[[d for d in ids if rnd.random() < share]] = True
    want = ix.search(np.array(q, dtype=np.float64), limit=limit, allowed=lambda d: bool(mask[d]))
    assert ix.search(np.array(q, dtype=np.float64), limit=limit, mask=mask) == want
    moved = VectorIndex(4)
    for doc in ids:
        moved.add_unit(doc, ix.vector(doc))
    assert moved.search(np.array(q, dtype=np.float64), limit=limit, mask=mask) == want
    with pytest.raises(ValueError):
        moved.add_unit(ids[0], ix.vector(ids[0]))
    with pytest.raises(ValueError):
        VectorIndex(4).add_unit(1, ix.vector(ids[0]).astype(np.float64))
