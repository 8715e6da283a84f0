"""Shared pieces of the embedders: the error, the protocol, the config and row checks."""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from memmesh.crdt.errors import MemmeshError

PROVIDERS = ("none", "hashed", "local", "openai", "ollama")


class EmbedderError(MemmeshError):
    """An embedder could not produce vectors (not installed, network, timeout, bad reply, wrong dim).

    The message is meant for an operator: it says what failed and, where there is one, what to do.
    It never contains an API key.
    """


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised float32 rows.

    ``provider``/``model`` name the vector space; vectors are stored under :attr:`store_name`, so two
    embedders with the same store name must produce comparable vectors.
    """

    provider: str
    model: str

    @property
    def dim(self) -> int:  # read-only: a remote embedder learns it from its first reply
        ...

    @property
    def store_name(self) -> str:  # f"embeddings:{provider}/{model}"
        ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array of shape (len(texts), dim), unit rows; EmbedderError on any failure."""
        ...

    def load(self) -> None:
        """Whatever the first ``embed`` would load (a model file, a runtime session), loaded now;
        no network call. Auto-recall loads before its deadline starts, so loading never counts
        against it."""
        ...


@dataclass
class EmbedderConfig:
    """What config.yaml says about the embedder.

    provider: "none" | "hashed" | "local" | "openai" | "ollama".
    model: provider's model name; None picks the provider's default.
    api_base: server root for openai/ollama (with or without a trailing /v1 for openai).
    api_key_ref: a reference to the secret (resolved by the caller, passed as ``api_key``).
    timeout_s: bound on one HTTP request (connect + whole reply).
    dim: expected vector size; None = the model's known size (or learnt from the first reply).
    """

    provider: str
    model: str | None = None
    api_base: str | None = None
    api_key_ref: str | None = None
    timeout_s: float = 10.0
    dim: int | None = None


def store_name_for(provider: str, model: str) -> str:
    """The store holding this model's vectors. Model names from hubs may hold capitals, '/' or
    ':' ("BAAI/bge-small", "nomic-embed-text:latest"); store names allow only a-z 0-9 _ . : -, so
    the model part is lower-cased and every other character becomes '-'."""
    safe = re.sub(r"[^a-z0-9_.:-]", "-", model.lower())
    return f"embeddings:{provider}/{safe}"


def check_texts(texts: Sequence[str]) -> list[str]:
    """Validate the input of ``embed``: a sequence of str (a bare str is refused, not split)."""
    if isinstance(texts, (str, bytes)):
        raise EmbedderError("embed() takes a sequence of texts, not a single string")
    try:
        out = list(texts)
    except TypeError as exc:
        raise EmbedderError(f"embed() takes a sequence of texts, got {type(texts).__name__}") from exc
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise EmbedderError(f"embed(): text {i} is {type(t).__name__}, not str")
    return out


def normalise_rows(mat: np.ndarray, *, what: str) -> np.ndarray:
    """Check a (n, dim) matrix of floats and return it as float32 with unit rows.

    Raises EmbedderError on non-finite values or a zero row (which has no direction).
    """
    arr = np.asarray(mat, dtype=np.float64)
    if arr.ndim != 2:
        raise EmbedderError(f"{what}: expected a 2-d array of vectors, got shape {arr.shape}")
    if arr.size and not np.all(np.isfinite(arr)):
        raise EmbedderError(f"{what}: a vector contains NaN or infinity")
    norms = np.sqrt(np.einsum("ij,ij->i", arr, arr))
    if arr.shape[0] and np.any(norms <= 1e-30):
        bad = int(np.argmax(norms <= 1e-30))
        raise EmbedderError(f"{what}: vector {bad} is all zeros and cannot be normalised")
    if arr.shape[0]:
        arr = arr / norms[:, None]
    return np.ascontiguousarray(arr, dtype=np.float32)


def exact_unit(vec: list[float]) -> np.ndarray:
    """Normalise one float64 vector with correctly rounded arithmetic only (+, *, /, sqrt, fsum).

    The result is bit-identical on every IEEE-754 machine, whatever SIMD or BLAS numpy uses.
    """
    norm = math.sqrt(math.fsum(v * v for v in vec))
    if norm == 0.0:
        raise EmbedderError("cannot normalise a zero vector")
    return np.array([v / norm for v in vec], dtype=np.float64).astype(np.float32)
