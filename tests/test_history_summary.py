"""The extractive summariser and the context window: pure functions, checked by examples and properties."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memmesh.node.history.pyramid import build
from memmesh.node.history.record import Turn
from memmesh.node.history.summary import budget_for, rank, select, split_sentences, summarise, word_count
from memmesh.node.history.window import build_window

# ------------------------------------------------------------------------------ sentences


def test_split_sentences_cuts_after_terminators_and_at_line_breaks():
    text = 'Deploy at noon.  Is the port 5433? "Yes!" she said\nsecond line\n\n  third   line  '
    assert split_sentences(text) == ["Deploy at noon.", "Is the port 5433?", '"Yes!"', "she said",
                                     "second line", "third line"]


def test_split_sentences_keeps_dots_inside_words_and_numbers():
    assert split_sentences("Version 3.11 is in /usr/lib.x today. Done") == ["Version 3.11 is in /usr/lib.x today.", "Done"]
    assert split_sentences("") == [] and split_sentences(" \n\t ") == []


# ------------------------------------------------------------------------------ selection


def test_rare_specific_sentences_outrank_recurring_filler():
    sentences = ["Let me check that for you.", "The staging database moved to port 5433.", "Let me check that for you.",
                 "Thanks, let me check.", "Let me check that for you."]
    assert rank(sentences)[0] == 1
    assert select(sentences, 7) == [1]


def test_ties_go_to_the_earlier_sentence():
    sentences = ["alpha beta.", "gamma delta.", "epsilon zeta."]
    assert rank(sentences) == [0, 1, 2]
    assert select(sentences, 4) == [0, 1]


def test_a_sentence_that_does_not_fit_is_skipped_and_a_smaller_one_taken():
    sentences = ["unique1 unique2 unique3 unique4 unique5 unique6.", "short rare.", "filler words of the sort."]
    assert select(sentences, 3) == [1]
    assert select(sentences, 0) == []
    with pytest.raises(ValueError):
        select(sentences, -1)


def test_summarise_keeps_order_and_the_budget():
    texts = ["The deploy key is now in vault path secret/ci/deploy.", "Ok thanks.",
             "Let me check that for you now please.", "The database port moved to 5433 on staging."]
    out = summarise(texts)
    budget = budget_for(sum(word_count(t) for t in texts))
    assert word_count(out) <= budget == 8
    assert out == "The database port moved to 5433 on staging."


def test_summarise_cuts_the_best_sentence_when_none_fits():
    out = summarise(["supercalifragilistic expialidocious quite long sentence here"], 0.3)
    assert out == "supercalifragilistic"  # budget floor(0.3 * 6) = 1 word
    assert summarise([]) == "" and summarise(["   "]) == ""
    with pytest.raises(ValueError):
        summarise(["x y"], 0)


sentence = st.text(alphabet=st.sampled_from("abcdefgh xyz01.!?\n"), min_size=0, max_size=60)


@settings(max_examples=200, deadline=None)
@given(st.lists(sentence, max_size=20), st.integers(0, 60))
def test_select_never_exceeds_its_budget_and_is_deterministic(texts, budget):
    sentences = [s for t in texts for s in split_sentences(t)]
    chosen = select(sentences, budget)
    assert chosen == sorted(set(chosen))
    assert sum(word_count(sentences[i]) for i in chosen) <= budget
    assert chosen == select(list(sentences), budget)


@settings(max_examples=200, deadline=None)
@given(st.lists(sentence, max_size=20), st.floats(0.01, 1.0))
def test_summarise_stays_within_ratio(texts, ratio):
    out = summarise(texts, ratio)
    words = sum(word_count(t) for t in texts)
    assert word_count(out) <= budget_for(words, ratio)
    assert (out == "") == (words == 0)


# ------------------------------------------------------------------------------ window


def _turns(n: int, lengths: list[int]) -> tuple[list[Turn], dict[str, str]]:
    turns, texts = [], {}
    for seq in range(1, n + 1):
        tid = f"sha256:{seq:064x}/1/{seq}"
        texts[tid] = (f"turn{seq} " + "w" * lengths[(seq - 1) % len(lengths)]).strip()
        turns.append(Turn(tid, "s", seq, "user" if seq % 2 else "assistant", "0" * 64, "k", seq, (seq, "e", 0)))
    return turns, texts


def _window(n: int, lengths: list[int], budget: int):
    turns, texts = _turns(n, lengths)
    p = build("s", turns)
    summaries = {c.id: f"summary {c.level} of {c.from_seq}-{c.to_seq} " + "s" * (c.level * 30)
                 for c in (*p.level1, *p.level2)}
    return p, build_window(p, lambda t: texts[t.id], lambda c: summaries[c.id], budget)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 230), st.lists(st.integers(0, 400), min_size=1, max_size=7), st.integers(1, 20_000))
def test_window_never_exceeds_its_budget_and_falls_in_resolution_with_age(n, lengths, budget):
    p, w = _window(n, lengths, budget)
    assert len(w.text) <= budget
    assert w.text == "\n".join(i.line for i in w.items)
    # oldest first, one unbroken stretch ending at the newest turn, never finer before coarser
    levels = [i.level for i in w.items]
    assert levels == sorted(levels, reverse=True)
    spans = [(i.from_seq, i.to_seq) for i in w.items]
    for (_, b1), (a2, _) in zip(spans, spans[1:]):
        assert a2 == b1 + 1
    if w.items:
        assert w.items[-1].to_seq == n


def test_a_budget_for_every_turn_shows_every_turn_raw():
    turns, texts = _turns(125, [20])
    p = build("s", turns)
    full = len("\n".join(f"{t.role}: {texts[t.id]}" for t in turns))
    w = build_window(p, lambda t: texts[t.id], lambda c: "x", full)
    assert [i.kind for i in w.items] == ["turn"] * 125 and w.chars == full
    smaller = build_window(p, lambda t: texts[t.id], lambda c: "x", full - 1)
    assert smaller.items[0].kind == "chunk" and smaller.items[-1].kind == "turn"
