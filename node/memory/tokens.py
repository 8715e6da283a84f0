"""Tokenisation for lexical recall (docs/memory.md, "Ranking").

Rules, exactly:

* The text is lowercased with :meth:`str.lower` first, then split.
* A token is a maximal run of characters ``c`` with ``c.isalnum()`` true. That is
  Unicode-aware: letters of any script (categories L*), and every character with a
  numeric value (decimal digits, other digits such as superscripts, numeric
  letters/fractions such as roman numerals and "½"). Everything else separates
  tokens: whitespace, punctuation, symbols, the underscore, and combining marks
  (category M*). No Unicode normalisation is applied, so text in decomposed form
  (NFD, "e" + U+0301) splits at the combining mark; callers that want "café" in NFD
  to match NFC must normalise before storing and querying.
* Tokens shorter than 2 characters (code points) are dropped.
* No stemming and no stopwords. Scripts written without spaces (Chinese, Japanese)
  therefore give one token per run of characters.

The document text of a memory row is ``key + " " + value + " " + " ".join(tags)``
(:func:`document_text`); the vector of a row is computed from ``key + " " + value``
only (that is the embedder's business, not this module's).

Stopwords are used by auto-recall only, to build its query from the last messages of
a conversation (:func:`autorecall_query_tokens`); explicit ``recall`` queries and
stored documents keep every token. :data:`STOPWORDS` is this project's own list of
English function words, pronouns, auxiliaries and the fragments that the tokenizer
makes of contractions ("don't" -> "don", "t"; the one-letter part is dropped anyway).
Every entry is lowercase and at least 2 characters long, so it can only ever match a
token that the tokenizer emits.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

__all__ = [
    "MIN_TOKEN_LENGTH",
    "STOPWORDS",
    "autorecall_query_tokens",
    "document_text",
    "tokenize",
]

MIN_TOKEN_LENGTH = 2

# In Python's ``re`` (str patterns), ``\w`` is exactly "str.isalnum() or '_'", so ``[^\W_]`` is
# exactly str.isalnum() (tests/test_ranking.py checks this). With the length rule folded into
# the pattern, a greedy match is a maximal run of MIN_TOKEN_LENGTH or more characters and
# shorter runs never match: one pass in C instead of a filter in Python.
_TOKEN_RE = re.compile(rf"[^\W_]{{{MIN_TOKEN_LENGTH},}}")


def tokenize(text: str) -> list[str]:
    """Lowercase ``text`` and return its alphanumeric runs of length >= 2, in order.

    Duplicates are kept (term frequency matters to BM25).
    """
    return _TOKEN_RE.findall(text.lower())


def document_text(key: str, value: str, tags: Iterable[str]) -> str:
    """The lexical document of a memory row: key, value and tags joined by spaces."""
    return key + " " + value + " " + " ".join(tags)


STOPWORDS: frozenset[str] = frozenset(
    ["about", "above", "across", "after", "again", "against", "ah", "all", "almost", "along", "already", "also", "although", "always", "am", "among", "an", "and", "another", "any", "anybody", "anyone", "anything", "anyway", "anywhere", "are", "aren", "around", "as", "at", "be", "became", "because", "become", "been", "before", "behind", "being", "below", "beside", "besides", "between", "beyond", "both", "but", "by", "can", "cannot", "could", "couldn", "did", "didn", "do", "does", "doesn", "doing", "don", "done", "down", "during", "each", "either", "else", "enough", "even", "ever", "every", "everybody", "everyone", "everything", "except", "few", "for", "from", "further", "get", "gets", "getting", "got", "had", "hadn", "has", "hasn", "have", "haven", "having", "he", "her", "here", "hers", "herself", "him", "himself", "his", "how", "however", "if", "in", "inside", "instead", "into", "is", "isn", "it", "its", "itself", "just", "least", "less", "let", "lets", "like", "ll", "many", "may", "me", "might", "mightn", "mine", "more", "most", "much", "must", "mustn", "my", "myself", "neither", "needn", "never", "no", "nobody", "none", "nor", "not", "nothing", "now", "of", "off", "often", "oh", "ok", "okay", "on", "once", "only", "onto", "or", "other", "others", "otherwise", "ought", "our", "ours", "ourselves", "out", "over", "own", "per", "perhaps", "please", "quite", "rather", "re", "really", "same", "shall", "shan", "she", "should", "shouldn", "since", "so", "some", "somebody", "someone", "something", "sometimes", "somewhere", "still", "such", "than", "that", "the", "their", "theirs", "them", "themselves", "then", "there", "these", "they", "this", "those", "though", "through", "thus", "till", "to", "too", "toward", "towards", "under", "until", "up", "upon", "us", "ve", "very", "via", "was", "wasn", "we", "well", "were", "weren", "what", "whatever", "when", "whenever", "where", "whether", "which", "while", "who", "whoever", "whom", "whose", "why", "will", "with", "within", "without", "won", "would", "wouldn", "yeah", "yes", "yet", "you", "your", "yours", "yourself", "yourselves"]
)


def autorecall_query_tokens(messages: Sequence[str], last: int = 5) -> list[str]:
    """Query tokens for auto-recall: the last ``last`` messages joined, tokenised,
    stopwords removed (order and duplicates kept).

    Messages are joined with a newline, which is a separator, so no token spans two
    messages. ``last`` must be at least 1.
    """
    if isinstance(last, bool) or not isinstance(last, int) or last < 1:
        raise ValueError(f"last must be a positive integer, got {last!r}")
    window = list(messages)[-last:]
    return [t for t in tokenize("\n".join(window)) if t not in STOPWORDS]
