"""Memory ranking core: tokenisation, BM25, vectors and fusion (pure, no storage)."""

from .bm25 import InvertedIndex
from .fusion import rank_candidates, rrf
from .tokens import STOPWORDS, autorecall_query_tokens, document_text, tokenize
from .vectors import VectorIndex

__all__ = [
    "STOPWORDS",
    "InvertedIndex",
    "VectorIndex",
    "autorecall_query_tokens",
    "document_text",
    "rank_candidates",
    "rrf",
    "tokenize",
]
