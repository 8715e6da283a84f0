"""Extractive summaries for the history pyramid: IDF-density sentence selection.

A chunk's summary is a subset of its sentences, chosen without a model call, so every
replica that recomputes it gets the same bytes.

Why IDF-density and not TextRank: centrality-based summarisers (TextRank, LexRank) keep
the sentences most similar to the rest, which in a conversation are the recurring,
generic ones ("let me check", "thanks, that works"). The turns later questions need are
the ones carrying rare specifics: a name, a number, a path, a decision stated once. A
sentence's IDF density (how many rare content words it carries per word) ranks those
first and costs one pass over the words.

Rules, exactly:

* **Sentences** (:func:`split_sentences`): whitespace runs are collapsed to one space
  after splitting; a text is cut at every line break and after a run of ``.``, ``!`` or
  ``?`` (optionally followed by closing quotes or brackets) that is followed by
  whitespace. Empty pieces are dropped. Pure string rules, no locale, no abbreviation
  list ("e.g. this" is two sentences: acceptable for selection, and deterministic).
* **Words** (the budget unit): the whitespace-separated pieces of a sentence
  (``len(s.split())``); every sentence has at least one.
* **Content words**: the tokens of :func:`node.memory.tokens.tokenize` that are not in
  :data:`node.memory.tokens.STOPWORDS` (as auto-recall builds its query).
* **idf** over the sentences given, each sentence one document:
  ``idf(w) = ln(1 + N / df(w))`` (smoothed, so it is > 0 even when N == df: a single
  sentence still has a positive score if it has a content word).
* **score(s)** = sum of ``idf(w)`` over the *distinct* content words of ``s``, divided
  by the number of words of ``s``. Distinct, not every occurrence: repeating a rare word
  adds no information and would let "error error error" outrank a specific sentence.
  The sum runs over the words in sorted order (set order varies between processes), and
  the score is quantised to 1e-9 (an integer) before comparison, so a last-bit difference
  between two platforms' ``log`` cannot reorder sentences; ties go to the earlier one.
* **Greedy** (:func:`select`): sentences in order of (score descending, index
  ascending); each is taken when its words fit in what is left of the budget, otherwise
  skipped and the next one tried. The result never exceeds the budget. A sentence
  longer than the whole budget is never chosen by :func:`select` (indexes cannot express
  a cut); when nothing at all fits, :func:`summarise` falls back to the first
  ``budget`` words of the best-ranked sentence, so a non-empty text never has an empty
  summary and the budget still holds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from ..memory.tokens import STOPWORDS, tokenize

__all__ = ["DEFAULT_RATIO", "budget_for", "fill", "rank", "select", "split_sentences", "summarise", "word_count"]

DEFAULT_RATIO = 0.3
_QUANTUM = 1_000_000_000  # scores are compared as round(score * 1e9)

# A sentence ends after terminal punctuation (plus closing quotes/brackets) followed by
# whitespace; the whitespace itself is the cut. Line breaks always cut.
_BOUNDARY = re.compile(r"(?<=[.!?])[\"'\u201d\u2019)\]]*\s+|\s*[\r\n]+\s*")
_SPACES = re.compile(r"\s+")


def split_sentences(text: str) -> list[str]:
    """Cut ``text`` into sentences (rules in the module docstring); never an empty one."""
    out: list[str] = []
    pos = 0
    for m in _BOUNDARY.finditer(text):
        # keep the closing quotes/brackets with the sentence they close
        end = m.start() + len(m.group(0)) - len(m.group(0).lstrip("\"'\u201d\u2019)]"))
        out.append(text[pos:end])
        pos = m.end()
    out.append(text[pos:])
    result = []
    for piece in out:
        s = _SPACES.sub(" ", piece).strip()
        if s:
            result.append(s)
    return result


def word_count(text: str) -> int:
    """Words in the budget's sense: whitespace-separated pieces."""
    return len(text.split())


def _scores(sentences: Sequence[str]) -> list[int]:
    content = [frozenset(t for t in tokenize(s) if t not in STOPWORDS) for s in sentences]
    df: dict[str, int] = {}
    for words in content:
        for w in words:
            df[w] = df.get(w, 0) + 1
    n = len(sentences)
    idf = {w: math.log(1.0 + n / d) for w, d in df.items()}
    scores = []
    for s, words in zip(sentences, content):
        total = 0.0
        for w in sorted(words):
            total += idf[w]
        length = max(word_count(s), 1)
        scores.append(round(total / length * _QUANTUM))
    return scores


def rank(sentences: Sequence[str]) -> list[int]:
    """Indexes of ``sentences`` best first: score descending, then index ascending."""
    scores = _scores(sentences)
    return sorted(range(len(sentences)), key=lambda i: (-scores[i], i))


def select(sentences: Sequence[str], budget_words: int) -> list[int]:
    """Indexes (ascending) of the sentences chosen within ``budget_words`` words."""
    if isinstance(budget_words, bool) or not isinstance(budget_words, int) or budget_words < 0:
        raise ValueError(f"budget_words must be a non-negative integer, got {budget_words!r}")
    return fill(rank(sentences), sentences, budget_words)


def fill(order: Sequence[int], sentences: Sequence[str], budget_words: int) -> list[int]:
    """Indexes (ascending) taken greedily in ``order`` (a sentence that fits in what is left is
    taken, one that does not is skipped): how :func:`select` fills its budget, and how the
    benchmark fills it for the other rankings it compares."""
    left = budget_words
    chosen = []
    for i in order:
        if left <= 0:
            break
        size = word_count(sentences[i])
        if size <= left:
            chosen.append(i)
            left -= size
    return sorted(chosen)


def budget_for(total_words: int, ratio: float = DEFAULT_RATIO) -> int:
    """``floor(ratio * total_words)``, at least 1 when there are words."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) or ratio <= 0:
        raise ValueError(f"ratio must be a positive finite number, got {ratio!r}")
    if total_words <= 0:
        return 0
    return max(1, math.floor(ratio * total_words))


def summarise(texts: Sequence[str], ratio: float = DEFAULT_RATIO) -> str:
    """The chosen sentences of ``texts`` in their original order, joined with one space.

    Sentences never span two texts. Budget: :func:`budget_for` over the words of all
    texts. Empty (or whitespace-only) input gives "".
    """
    sentences = [s for t in texts for s in split_sentences(t)]
    budget = budget_for(sum(word_count(s) for s in sentences), ratio)
    if not sentences:
        return ""
    chosen = select(sentences, budget)
    if not chosen:
        best = sentences[rank(sentences)[0]]
        return " ".join(best.split()[:budget])
    return " ".join(sentences[i] for i in chosen)
