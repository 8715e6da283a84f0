"""The checks of what a caller passes a memory view: an embeddings store name, a vector
length, the tags to filter by, a query vector. Each refusal is a MemoryInputError that says
what was expected."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .rows import MemoryInputError, is_embedding_store


def check_store(store: Any) -> str | None:
    if store is None:
        return None
    if not is_embedding_store(store):
        raise MemoryInputError(f"{store!r} is not an embeddings store name (embeddings:<provider>/<model>)")
    return store


def check_dim(dim: Any) -> int | None:
    if dim is None:
        return None
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise MemoryInputError(f"dim must be a positive integer, got {dim!r}")
    return int(dim)


def check_filter_tags(tags: Any, what: str = "tag") -> frozenset[str]:
    """The tags (or entities: ``what``) a recall requires, casefolded: an AND filter."""
    if tags is None:
        return frozenset()
    if isinstance(tags, (str, bytes)) or not isinstance(tags, Sequence):
        raise MemoryInputError(f"{what}s must be a list of strings, got {type(tags).__name__}")
    for tag in tags:
        if not isinstance(tag, str) or not tag:
            raise MemoryInputError(f"every {what} to filter by must be a non-empty string")
    return frozenset(t.casefold() for t in tags)


def check_query_vector(vector: Any) -> np.ndarray | None:
    if vector is None:
        return None
    arr = np.asarray(vector)
    if arr.ndim != 1 or arr.size == 0 or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
    ):
        raise MemoryInputError(f"query_vector must be a non-empty 1-d array of numbers, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise MemoryInputError("query_vector has NaN or infinite values")
    return arr
