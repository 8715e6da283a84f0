"""The array-backed maps a memory view keeps instead of a Python object per row or key
(node/memory/order_columns.py, multimap.py, key_table.py), against plain dicts: every sequence
of writes, compactions and pickles (a view snapshot) answers as the dict would."""
from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from memmesh.node.memory.key_table import KeyTable
from memmesh.node.memory.multimap import IntMultiMap
from memmesh.node.memory.order_columns import OrderColumns
from memmesh.node.memory.rows import order_desc_key

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
