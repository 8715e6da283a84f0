"""The recall budget: the Relevant Memories block fits the answering model's context window."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memmesh.auth.errors import MemmeshError
from memmesh.node import commands
from memmesh.node.memory.framing import HEADING, budget_chars, closing_line, fit, memory_line, missing_line

CLOSING = re.compile(r"^\.\.\. (\d+) more memor(?:y|ies) not shown; use recall$")


def test_the_budget_meets_its_anchors():
    assert budget_chars(100_000) == 2_400
    assert budget_chars(250_000) == 6_000 == budget_chars(1_000_000)  # 2.5x, and no more
    assert budget_chars(200_000) == 4_800  # linear in between
    assert budget_chars(29_000) == 696  # the knee: the linear scale ends here ...
    assert budget_chars(20_000) < 20_000 * 24 // 1000  # ... and below it the budget falls faster
    assert budget_chars(8_000) == 0 == budget_chars(1_000) == budget_chars(0)  # a very small window


@given(st.integers(0, 2_000_000), st.integers(0, 2_000_000))
def test_the_budget_is_monotone(a, b):
    lo, hi = sorted((a, b))
    assert budget_chars(lo) <= budget_chars(hi)


texts = st.text(min_size=1, max_size=300)


@settings(max_examples=150)
@given(st.lists(st.tuples(texts, texts, st.one_of(st.none(), st.text(max_size=20))), max_size=40),
       st.integers(0, 400_000), st.lists(st.text(min_size=1, max_size=64), max_size=3))
def test_the_block_never_exceeds_its_budget_and_counts_what_it_left_out(rows, window, missing):
    lines = [memory_line(k, v, b) for k, v, b in rows]
    budget = budget_chars(window)
    block = fit(lines, budget, missing=missing)
    assert len(block.text) <= budget
    if not block.text:  # nothing fits (or nothing to show): no heading, nothing counted
        assert (block.shown, block.left_out) == (0, 0)
        return
    out = block.text.rstrip("\n").split("\n")
    assert out[0] == HEADING
    body = out[4:]
    assert body[:block.shown] == lines[:block.shown]  # a prefix, in rank order
    rest = body[block.shown:]
    if missing:  # the stores not searched: one line, right after the memories
        assert rest[0] == missing_line(missing) and rest[0].startswith("_Not searched this turn")
        rest = rest[1:]
    if block.left_out:
        assert len(rest) == 1 and int(CLOSING.match(rest[0]).group(1)) == block.left_out
        assert block.shown + block.left_out == len(lines)
    else:
        assert rest == [] and block.shown == len(lines)


def test_the_longest_prefix_that_fits_is_shown():
    lines = [f"- **k{i}**: " + "x" * 50 for i in range(10)]
    full = fit(lines, 10_000)
    assert full.shown == 10 and full.left_out == 0 and "not shown" not in full.text
    part = fit(lines, len(full.text) - 1)  # one character short: the last line gives way
    assert part.shown == 9 and part.left_out == 1 and part.text.endswith(closing_line(1) + "\n")
    assert fit(lines, len(part.text) - 1).shown < 9
    assert fit(lines, 10).text == ""  # not even the frame fits


# ---------------------------------------------------------------------- through the node
@pytest.fixture
def node(node):
    """conftest's node (alpha, no embedder) with 20 deploy steps alpha's auto-recall may all show."""
    commands.memory_config(node, "alpha", "set", "max_entries", "20")
    for i in range(20):
        node.call_tool("alpha", "remember", {"key": f"deploy step {i}",
                                             "value": f"the deploy runbook, step {i}: " + "details " * 20})
    return node


def injections(node, key):
    found = node.call_tool("alpha", "recall", {"query": key, "limit": 20})  # counts as a recall, not an injection
    return {m["key"]: m["injections"] for m in found["memories"]}


def test_a_small_window_shows_fewer_lines_and_counts_only_those(node):
    messages = ["how does the deploy runbook go?"]
    wide = node.run("autorecall", {"agent": "alpha", "messages": messages, "context_window": 250_000,
                                   "no_count": True}).data
    narrow = node.run("autorecall", {"agent": "alpha", "messages": messages, "context_window": 32_000}).data
    assert len(narrow["block"]) <= budget_chars(32_000) < len(wide["block"]) <= budget_chars(250_000)
    shown = [line["key"] for line in narrow["lines"]]
    assert 0 < len(shown) < 20 and narrow["not_shown"] == 20 - len(shown)
    assert narrow["block"].rstrip("\n").endswith(f"... {20 - len(shown)} more memories not shown; use recall")
    counts = injections(node, "deploy runbook step")
    assert {k for k, c in counts.items() if c} == set(shown)  # lines left out are not injections
    assert node.auto_recall("alpha", messages, context_window=5_000) == ""  # a very small window


def test_a_bad_window_is_refused(node):
    for bad in (-1, "wide", 1.5):
        with pytest.raises(MemmeshError):
            node.run("autorecall", {"agent": "alpha", "messages": ["deploy"], "context_window": bad})
