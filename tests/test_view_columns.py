"""The array-backed maps a memory view keeps instead of a Python object per row or key
(node/memory/order_columns.py, multimap.py, key_table.py, str_ids.py), against plain dicts: every sequence
of writes, compactions and pickles (a view snapshot) answers as the dict would."""
from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memmesh.node.memory.key_table import KeyTable
from memmesh.node.memory.multimap import IntMultiMap
from memmesh.node.memory.order_columns import OrderColumns
from memmesh.node.memory.rows import order_desc_key
from memmesh.node.memory.str_ids import StrIds

orders = st.tuples(st.integers(0, 2**40), st.binary(min_size=32, max_size=32).map(lambda b: "sha256:" + b.hex()),
                   st.integers(0, 2**31))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), orders), max_size=40), st.integers(0, 40))
def test_order_columns_answer_as_a_dict(writes, pickle_at):
    cols, model = OrderColumns(), {}
    for i, (doc, order) in enumerate(writes):
        if i == pickle_at:
            cols = pickle.loads(pickle.dumps(cols, protocol=5))
        if i % 3 == 0:
            cols.scatter([doc], [order])
        else:
            cols.set(doc, order)
        model[doc] = order
    for doc in range(302):
        assert cols.get(doc) == model.get(doc)
        assert (doc in cols) == (doc in model)
        if doc in model:
            assert cols.desc_key(doc) == order_desc_key(model[doc])
    dense = OrderColumns()
    dense.set_many(0, [o for _d, o in writes])
    rank = dense.t_rank(len(writes)).tolist()
    assert sorted(range(len(writes)), key=rank.__getitem__) == sorted(range(len(writes)), key=lambda i: writes[i][1])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("add"), st.integers(0, 20), st.integers(0, 10**6)),
                          st.just(("compact", 0, 0)), st.just(("pickle", 0, 0))), max_size=60))
def test_an_int_multimap_answers_as_a_dict_of_lists(ops):
    mm, model = IntMultiMap(), {}
    for op, key, value in ops:
        if op == "add":
            mm.add(key, value)
            model.setdefault(key, []).append(value)
        elif op == "compact":
            mm.compact()
        else:
            mm = pickle.loads(pickle.dumps(mm, protocol=5))
        assert len(mm) == sum(map(len, model.values()))
    for key in range(-1, 22):
        assert mm.get(key) == model.get(key, [])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["set_current", "drop_current", "set_newest", "pickle"]),
                          st.sampled_from(["a", "b", "c", "d", "é"]), st.integers(0, 1000)), max_size=50))
def test_a_key_table_answers_as_dicts(ops):
    keys, current, newest = KeyTable(), {}, {}
    for op, key, doc in ops:
        if op == "set_current":
            keys.set_current(key, doc)
            current[key] = doc
        elif op == "drop_current":
            assert keys.drop_current(key) == current.pop(key, None)
        elif op == "set_newest":
            keys.set_newest(key, doc)
            newest[key] = doc
        else:
            keys = pickle.loads(pickle.dumps(keys, protocol=5))
        assert len(keys) == len(current)
    for key in ["a", "b", "c", "d", "é", "z"]:
        assert keys.current(key) == current.get(key)
        assert keys.newest(key) == newest.get(key)
    assert sorted(keys.current_items()) == sorted(current.items())
    assert keys.current_docs().tolist() == sorted(current.values())


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("add"), st.text(max_size=4)),
                          st.tuples(st.just("extend"), st.lists(st.text(min_size=5, max_size=8), max_size=4, unique=True)),
                          st.just(("pickle", None))), max_size=40),
       st.lists(st.text(max_size=8), max_size=10))
def test_str_ids_answer_as_a_dict_pickled_or_not(ops, probes):
    ids, model = StrIds(), {}
    for op, arg in ops:
        if op == "add":
            assert ids.add(arg) == model.setdefault(arg, len(model))
        elif op == "extend":
            new = [s for s in arg if s not in model]
            ids.extend(new)
            for s in new:
                model[s] = len(model)
        else:
            ids = pickle.loads(pickle.dumps(ids, protocol=5))  # reads go through the hash table
        for s in list(model)[:5] + probes:
            assert ids.get(s) == model.get(s)
            assert (s in ids) == (s in model)
    assert list(ids) == list(model) and len(ids) == len(model)
    assert all(ids.strings[i] == s for s, i in model.items())


def test_str_ids_refuse_a_string_numbered_twice():
    ids = StrIds(["a"])
    with pytest.raises(ValueError, match="already had an id"):
        ids.extend(["b", "a"])
    assert list(ids) == ["a"] and ids.get("b") is None  # refused: nothing changed
    with pytest.raises(ValueError, match="distinct"):
        StrIds(["x", "x"])
    with pytest.raises(KeyError):
        ids["zzz"]
