"""Text embedders for semantic recall (docs/memory.md, "Ranking").

Providers: ``none`` (no semantic ranking), ``hashed`` (numpy feature hashing, always available),
``local`` (MiniLM on onnxruntime, weights from the ``embed`` extra), ``openai`` (OpenAI's
embeddings API or a compatible server) and ``ollama``. Vectors are stored under
``Embedder.store_name`` = ``embeddings:<provider>/<model>``.
"""
from __future__ import annotations

from functools import lru_cache

from .base import PROVIDERS, Embedder, EmbedderConfig, EmbedderError, store_name_for
from .hashed import DEFAULT_DIM as HASHED_DEFAULT_DIM
from .hashed import HashedEmbedder
from .local import DEFAULT_LOCAL_MODEL, LOCAL_MODELS, LocalOnnxEmbedder, local_available, local_model_problem
from .remote import OllamaEmbedder, OpenAIEmbedder

__all__ = [
    "Embedder", "EmbedderConfig", "EmbedderError", "HashedEmbedder", "LocalOnnxEmbedder",
    "OpenAIEmbedder", "OllamaEmbedder", "make_embedder", "default_provider", "PROVIDERS",
    "DEFAULT_LOCAL_MODEL", "LOCAL_MODELS", "HASHED_DEFAULT_DIM", "local_available",
    "local_model_problem", "store_name_for",
]


def make_embedder(cfg: EmbedderConfig, *, api_key: str | None = None) -> Embedder | None:
    """Build the embedder a config asks for; None for provider "none".

    Raises EmbedderError with an actionable message for an unknown provider, a bad setting, or a
    provider whose extra is not installed. Nothing is sent over the network here.
    """
    provider = (cfg.provider or "").strip().lower()
    if provider not in PROVIDERS:
        raise EmbedderError(f"unknown embeddings provider {cfg.provider!r}; choose one of {', '.join(PROVIDERS)}")
    if provider == "none":
        return None
    if provider == "hashed":
        return HashedEmbedder(dim=cfg.dim if cfg.dim is not None else HASHED_DEFAULT_DIM, model=cfg.model)
    if provider == "local":
        emb = LocalOnnxEmbedder(cfg.model)
        if cfg.dim is not None and cfg.dim != emb.dim:
            raise EmbedderError(f"local embedder: model {emb.model} makes {emb.dim}-d vectors, config says dim={cfg.dim}")
        return emb
    cls = OpenAIEmbedder if provider == "openai" else OllamaEmbedder
    return cls(cfg.model, api_base=cfg.api_base, api_key=api_key, timeout_s=cfg.timeout_s, dim=cfg.dim)


@lru_cache(maxsize=1)
def default_provider() -> str:
    """"local" if the local ONNX model and its runtime are installed, else "hashed"."""
    return "local" if local_available(DEFAULT_LOCAL_MODEL) else "hashed"
