"""HashedEmbedder: a dependency-free, deterministic bag-of-features embedder (numpy only).

Algorithm "hashed-v1" (changing any step below changes the vectors, so it must get a new model name):

1. text -> NFKC -> lower case -> tokens = maximal runs of Unicode letters/digits; tokens shorter than
   2 characters are dropped (as in the BM25 tokeniser, docs/memory.md "Ranking").
2. features, each with a weight:
   - ``w:<token>`` weight 1.0 (0.25 for a small fixed list of English stopwords);
   - character 3- and 4-grams of ``<token>`` (with the angle brackets as word boundaries), prefixed
     ``c:``; a token's n-grams share weight 0.5 (each gets 0.5 / sqrt(number of its n-grams)),
     so a long word does not outweigh a short one; stopwords get no n-grams.
3. the weights of equal features add up; a feature's value is sqrt(summed weight) (sub-linear tf).
4. feature -> blake2b(feature, digest_size=8, person=b"memmesh-hash-v1"); bucket = first 4 bytes
   (little endian) mod dim; sign = +1 if bit 0 of byte 4 is set, else -1 (signed feature hashing).
5. buckets are summed in sorted feature order in float64, the vector is divided by its norm computed
   with math.fsum, then cast to float32. A text without tokens embeds as the feature ``e:``.

Only +, *, /, sqrt and a correctly rounded sum are used, so the vectors are bit-identical across
processes, machines and numpy builds (Python's randomised ``hash()`` is never used).
"""
from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from collections import defaultdict
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from .base import EmbedderError, check_texts, exact_unit, store_name_for

_TOKEN_RE = re.compile(r"[^\W_]+", re.UNICODE)
_PERSON = b"memmesh-hash-v1"

# Small, fixed (part of the algorithm): only down-weighted, never dropped.
STOPWORDS = frozenset(
    ["a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are", "as", "at", "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can", "could", "did", "do", "does", "doing", "down", "during", "each", "few", "for", "from", "further", "had", "has", "have", "having", "he", "her", "here", "hers", "herself", "him", "himself", "his", "how", "if", "in", "into", "is", "it", "its", "itself", "just", "me", "more", "most", "my", "myself", "no", "nor", "not", "now", "of", "off", "on", "once", "only", "or", "other", "our", "ours", "ourselves", "out", "over", "own", "same", "she", "should", "so", "some", "such", "than", "that", "the", "their", "theirs", "them", "themselves", "then", "there", "these", "they", "this", "those", "through", "to", "too", "under", "until", "up", "very", "was", "we", "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours", "yourself", "yourselves"]
)

WORD_WEIGHT = 1.0
STOPWORD_WEIGHT = 0.25
NGRAM_WEIGHT = 0.5
NGRAM_SIZES = (3, 4)
DEFAULT_DIM = 384


def tokenize(text: str) -> list[str]:
    text = unicodedata.normalize("NFKC", text).lower()
    return [t for t in _TOKEN_RE.findall(text) if len(t) >= 2]


def features(text: str) -> dict[str, float]:
    """The weighted features of one text (step 1-3 of the algorithm, before sqrt)."""
    acc: defaultdict[str, float] = defaultdict(float)
    for tok in tokenize(text):
        if tok in STOPWORDS:
            acc["w:" + tok] += STOPWORD_WEIGHT
            continue
        acc["w:" + tok] += WORD_WEIGHT
        padded = f"<{tok}>"
        grams = [padded[i : i + n] for n in NGRAM_SIZES for i in range(len(padded) - n + 1)]
        if grams:
            w = NGRAM_WEIGHT / math.sqrt(len(grams))
            for g in grams:
                acc["c:" + g] += w
    if not acc:
        acc["e:"] = 1.0
    return dict(acc)


@lru_cache(maxsize=1 << 16)
def _bucket(feature: str, dim: int) -> tuple[int, float]:
    h = hashlib.blake2b(feature.encode("utf-8"), digest_size=8, person=_PERSON).digest()
    return int.from_bytes(h[:4], "little") % dim, (1.0 if h[4] & 1 else -1.0)


class HashedEmbedder:
    """Deterministic feature-hashing embedder; no model, no network, numpy only."""

    provider = "hashed"

    def __init__(self, dim: int = DEFAULT_DIM, model: str | None = None):
        if not isinstance(dim, int) or isinstance(dim, bool) or not 16 <= dim <= 65536:
            raise EmbedderError(f"hashed embedder: dim must be an integer in 16..65536, got {dim!r}")
        expected = f"hashed-v1-{dim}"
        if model is not None and model != expected:
            raise EmbedderError(
                f"hashed embedder: unknown model {model!r}; with dim={dim} the model is {expected!r} "
                "(leave model unset to get it)"
            )
        self.dim = dim
        self.model = expected

    @property
    def store_name(self) -> str:
        return store_name_for(self.provider, self.model)

    def embed_one(self, text: str) -> np.ndarray:
        vec = [0.0] * self.dim
        for feat, weight in sorted(features(text).items()):
            idx, sign = _bucket(feat, self.dim)
            vec[idx] += sign * math.sqrt(weight)
        if not any(vec):  # every feature cancelled out (vanishingly rare): fall back to the marker
            idx, sign = _bucket("e:", self.dim)
            vec[idx] = sign
        return exact_unit(vec)

    def load(self) -> None:
        """Nothing to load: the vectors are computed from the text alone."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        items = check_texts(texts)
        out = np.zeros((len(items), self.dim), dtype=np.float32)
        for i, t in enumerate(items):
            out[i] = self.embed_one(t)
        return out

    def __repr__(self) -> str:
        return f"HashedEmbedder(dim={self.dim})"
