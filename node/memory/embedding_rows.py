"""Embedding rows: a memory row's vector in an ``embeddings:<provider>/<model>`` store, as
float32 little-endian bytes; what makes a store name and a row well formed, and their strict
parsing (a malformed row is ignored, logged at debug)."""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from memmesh.crdt.database import RowRecord, valid_store_name

from .input_error import MemoryInputError

log = logging.getLogger("memmesh.node.memory.rows")  # the rows' one logger: its debug lines keep their name

EMBEDDINGS_PREFIX = "embeddings:"


def embedding_store(provider: str, model: str) -> str:
    """``embeddings:<provider>/<model>``; MemoryInputError if that is not a valid store name."""
    for what, part in (("provider", provider), ("model", model)):
        if not isinstance(part, str) or not part:
            raise MemoryInputError(f"embedding {what} must be a non-empty string")
    if "/" in provider:
        raise MemoryInputError(f"embedding provider {provider!r} may not contain '/'")
    name = f"{EMBEDDINGS_PREFIX}{provider}/{model}"
    if not valid_store_name(name):
        raise MemoryInputError(
            f"cannot store vectors of {provider}/{model}: the store name {name!r} must be at most "
            "128 characters of a-z, 0-9 and _ : . / - (lowercase)"
        )
    return name


def is_embedding_store(name: object) -> bool:
    """True for a valid store name of the form ``embeddings:...``."""
    return isinstance(name, str) and name.startswith(EMBEDDINGS_PREFIX) and valid_store_name(name)


def embedding_value(row_key: str, vector: np.ndarray) -> dict[str, Any]:
    """The value of an embedding row for memory row ``row_key``: float32 little-endian bytes."""
    if not isinstance(row_key, str) or not row_key:
        raise MemoryInputError("an embedding needs the row key of its memory row (a non-empty string)")
    arr = np.asarray(vector)
    if arr.ndim != 1 or arr.size == 0 or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
    ):
        raise MemoryInputError(f"an embedding must be a non-empty 1-d array of numbers, got shape {arr.shape}")
    with np.errstate(over="ignore", invalid="ignore"):
        out = arr.astype("<f4")
    if not np.all(np.isfinite(out)):
        raise MemoryInputError("an embedding has NaN or infinite values (or values too large for float32)")
    return {"row": row_key, "v": out.tobytes()}


def _embedding_fields(record: RowRecord, dim: int | None) -> tuple[str, bytes] | None:
    """``(row, raw bytes)`` of an embedding row whose shape is right (finiteness unchecked)."""
    value = record.value
    if not isinstance(value, dict):
        log.debug("ignoring embedding row %s of entry %s: value is %s, not an object",
                  record.key, record.entry_id, type(value).__name__)
        return None
    row, raw = value.get("row"), value.get("v")
    if not isinstance(row, str) or not row:
        log.debug("ignoring embedding row %s of entry %s: 'row' is not a row key", record.key, record.entry_id)
        return None
    if not isinstance(raw, bytes) or not raw or len(raw) % 4:
        log.debug("ignoring embedding row %s of entry %s: 'v' is not float32 bytes", record.key, record.entry_id)
        return None
    n = len(raw) // 4
    if dim is not None and n != dim:
        log.debug("ignoring embedding row %s of entry %s: %d values, expected %d",
                  record.key, record.entry_id, n, dim)
        return None
    return row, raw


def _log_non_finite(record: RowRecord) -> None:
    log.debug("ignoring embedding row %s of entry %s: non-finite values", record.key, record.entry_id)


def parse_embedding(record: RowRecord, dim: int | None) -> tuple[str, np.ndarray] | None:
    """``(memory row key, float32 vector)`` of an embedding row, or None (logged at debug)
    if the row is malformed or, when ``dim`` is given, its vector has another length."""
    fields = _embedding_fields(record, dim)
    if fields is None:
        return None
    row, raw = fields
    vec = np.frombuffer(raw, dtype="<f4")
    if not np.all(np.isfinite(vec)):
        _log_non_finite(record)
        return None
    return row, vec.astype(np.float32, copy=False)


_FINITE_BLOCK = 1024


def parse_embeddings(records: Sequence[RowRecord], dim: int | None) -> list[tuple[str, np.ndarray] | None]:
    """:func:`parse_embedding` of each record, in order (the same verdicts, the same debug
    logs), with the finiteness check done for blocks of same-length vectors at once.

    The vectors are read-only views of the rows' bytes (float32).
    """
    out: list[tuple[str, np.ndarray] | None] = []
    by_len: dict[int, list[tuple[int, np.ndarray]]] = {}  # length -> (position in out, vector)
    for i, record in enumerate(records):
        fields = _embedding_fields(record, dim)
        if fields is None:
            out.append(None)
            continue
        vec = np.frombuffer(fields[1], dtype="<f4")
        out.append((fields[0], vec))
        by_len.setdefault(len(vec), []).append((i, vec))
    for same_len in by_len.values():
        for a in range(0, len(same_len), _FINITE_BLOCK):
            block = same_len[a : a + _FINITE_BLOCK]
            finite = np.isfinite(np.stack([v for _i, v in block])).all(axis=1)
            for j in np.flatnonzero(~finite).tolist():
                _log_non_finite(records[block[j][0]])
                out[block[j][0]] = None
    if np.dtype("<f4") != np.dtype(np.float32):  # pragma: no cover - big-endian hosts
        out = [None if p is None else (p[0], p[1].astype(np.float32)) for p in out]
    return out
