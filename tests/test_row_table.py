"""The rows of a view kept as columns (node/memory/row_table.py): what a doc reads back is the
memory it was given, packed or not, pickled (as a view snapshot holds it) or not; T order and
tie-break keys read from the columns are the rows' own."""
from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memmesh.node.memory.row_table import RowTable
from memmesh.node.memory.rows import Edge, Memory, order_desc_key

text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)
maybe_int = st.none() | st.integers(-(2**62), 2**62)
edges = st.lists(st.builds(Edge, st.sampled_from(["supersedes", "about", "see"]), text,
                           st.none() | st.just("sha256:" + "ab" * 32)), max_size=3).map(tuple)
entry_ids = st.binary(min_size=32, max_size=32).map(lambda b: "sha256:" + b.hex())


@st.composite
def memories(draw: st.DrawFn) -> Memory:
    entry = draw(entry_ids)
    return Memory(
        key=draw(text), value=draw(text), tags=tuple(draw(st.lists(text, max_size=3))),
        ts=draw(st.integers(0, 2**63 - 1)), author=draw(text), entry_id=entry, row_key=draw(text),
        order=(draw(st.integers(0, 2**40)), entry, draw(st.integers(0, 2**31))),
        category=draw(st.none() | text), confidence=draw(st.none() | st.integers(1, 10)),
        importance=draw(st.none() | st.integers(1, 10)), entities=tuple(draw(st.lists(text, max_size=3))),
        edges=draw(edges), valid_from=draw(maybe_int), valid_to=draw(maybe_int),
        source=draw(st.none() | st.sampled_from(["user", "tool", "inferred"])))


@settings(max_examples=60, deadline=None)
@given(st.lists(memories(), max_size=12), st.lists(memories(), max_size=6), st.booleans())
def test_rows_read_back_equal_packed_pickled_or_not(first, later, pickled):
    rows = RowTable()
    rows.extend(first)
    rows.pack()
    if pickled:
        rows = pickle.loads(pickle.dumps(rows, protocol=5))
    for m in later:
        rows.append(m)
    given_rows = first + later
    assert len(rows) == len(given_rows)
    assert list(rows) == given_rows
    for doc, m in enumerate(given_rows):
        assert [type(f) for f in vars_of(rows[doc])] == [type(f) for f in vars_of(m)]  # tuples stay tuples
        assert rows.order(doc) == m.order
        assert rows.desc_key(doc) == order_desc_key(m.order)
        assert rows.desc_keys[doc] == order_desc_key(m.order)
    ranks = rows.t_rank().tolist()
    assert sorted(range(len(given_rows)), key=ranks.__getitem__) == sorted(
        range(len(given_rows)), key=lambda d: given_rows[d].order)
    rows.pack()
    assert list(pickle.loads(pickle.dumps(rows))) == given_rows


def vars_of(m: Memory) -> list[object]:
    return [getattr(m, f) for f in Memory.__dataclass_fields__]


def test_a_doc_out_of_range_is_an_index_error():
    rows = RowTable()
    with pytest.raises(IndexError):
        rows[0]
    rows.append(Memory("k", "v", (), 0, "a", "sha256:" + "00" * 32, "r", (1, "sha256:" + "00" * 32, 0)))
    rows.pack()
    assert rows[0].key == "k"
    for doc in (-1, 1):
        with pytest.raises(IndexError):
            rows[doc]


def test_an_order_whose_entry_is_not_an_entry_id_is_refused():
    with pytest.raises(ValueError, match="not an entry id"):
        RowTable().append(Memory("k", "v", (), 0, "a", "e", "r", (1, "e", 0)))
