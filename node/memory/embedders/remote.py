"""Embedders that call an HTTP server: OpenAI's embeddings API (and compatible servers) and Ollama.

The call path of ``embed`` is synchronous (callers in async code run it in a thread), so this uses
the standard library's ``http.client`` -- the layer under ``urllib.request`` -- because it gives
direct control of the socket: the connect gets ``timeout_s`` and every later socket operation gets
only what is left of the same ``timeout_s`` budget, so a server that accepts and never answers, or
that trickles its reply, fails in about ``timeout_s`` and never more than one socket operation
beyond it. No new dependency; proxies from the environment are not used (an embeddings server is
configured by its address).
"""
from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import EmbedderError, check_texts, normalise_rows, store_name_for

MAX_RESPONSE_BYTES = 256 * 1024 * 1024
_USER_AGENT = "memmesh-embedder/1"

# Native sizes of common models; other models learn their size from the first reply.
KNOWN_DIMS: dict[str, int] = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
    "nomic-embed-text": 768,
    "mxbai-embed-large": 1024,
    "all-minilm": 384,
    "bge-m3": 1024,
    "snowflake-arctic-embed": 1024,
}


def _known_dim(model: str) -> int | None:
    return KNOWN_DIMS.get(model) or KNOWN_DIMS.get(model.split(":", 1)[0])


def _parse_base(api_base: str, *, strip_v1: bool) -> tuple[str, str, int, str]:
    """-> (scheme, host, port, path prefix without trailing slash)."""
    parsed = urllib.parse.urlsplit(api_base.strip())
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise EmbedderError(f"api_base must be an http(s) URL such as http://127.0.0.1:11434, got {api_base!r}")
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
    except ValueError as exc:
        raise EmbedderError(f"api_base has a bad port: {api_base!r}") from exc
    path = parsed.path.rstrip("/")
    if strip_v1 and path.endswith("/v1"):
        path = path[: -len("/v1")]
    return parsed.scheme, parsed.hostname, port, path


class _HttpJsonClient:
    """POST JSON, get JSON, with one overall deadline per request."""

    def __init__(self, what: str, scheme: str, host: str, port: int, timeout_s: float,
                 api_key: str | None):
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s <= 3600):
            raise EmbedderError(f"{what}: timeout_s must be in (0, 3600], got {timeout_s!r}")
        self.what = what
        self.scheme, self.host, self.port = scheme, host, port
        self.timeout_s = float(timeout_s)
        self._api_key = api_key
        self._ssl = ssl.create_default_context() if scheme == "https" else None

    def __repr__(self) -> str:  # never shows the key
        return f"<{self.what} {self.scheme}://{self.host}:{self.port}>"

    def post_json(self, path: str, body: dict[str, Any]) -> Any:
        deadline = time.monotonic() + self.timeout_s

        def remaining() -> float:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("deadline")
            return left

        payload = json.dumps(body).encode("utf-8")
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": _USER_AGENT,
        }
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        url = f"{self.scheme}://{self.host}:{self.port}{path}"
        conn: http.client.HTTPConnection
        if self._ssl is not None:
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout_s, context=self._ssl)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.connect()
            # Keep our own handle: getresponse() may hand the socket over to the response.
            sock = conn.sock
            sock.settimeout(remaining())
            conn.request("POST", path, body=payload, headers=headers)
            sock.settimeout(remaining())
            resp = conn.getresponse()
            chunks: list[bytes] = []
            size = 0
            while True:
                sock.settimeout(remaining())
                chunk = resp.read1(65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_RESPONSE_BYTES:
                    raise EmbedderError(f"{self.what}: reply from {url} is larger than {MAX_RESPONSE_BYTES} bytes")
                chunks.append(chunk)
                remaining()
            raw = b"".join(chunks)
            status = resp.status
        except EmbedderError:
            raise
        except TimeoutError as exc:
            raise EmbedderError(f"{self.what}: no complete reply from {url} within {self.timeout_s:g} s") from exc
        except ssl.SSLError as exc:
            raise EmbedderError(f"{self.what}: TLS error talking to {url}: {exc}") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise EmbedderError(f"{self.what}: cannot reach {url}: {exc.__class__.__name__}: {exc}") from exc
        finally:
            conn.close()
        if not 200 <= status < 300:
            snippet = raw[:300].decode("utf-8", "replace").strip()
            hint = ""
            if status in (401, 403):
                hint = " (check the API key)"
            elif status == 404:
                hint = " (check api_base and the model name)"
            raise EmbedderError(f"{self.what}: {url} answered HTTP {status}{hint}: {snippet}")
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise EmbedderError(f"{self.what}: {url} sent a reply that is not JSON: {raw[:120]!r}") from exc


def _to_matrix(what: str, vectors: Any, n: int, dim: int | None) -> np.ndarray:
    if not isinstance(vectors, list) or len(vectors) != n:
        got = len(vectors) if isinstance(vectors, list) else type(vectors).__name__
        raise EmbedderError(f"{what}: expected {n} vectors, got {got}")
    for i, v in enumerate(vectors):
        if not isinstance(v, list) or not v:
            raise EmbedderError(f"{what}: vector {i} is not a non-empty list of numbers")
        if dim is not None and len(v) != dim:
            raise EmbedderError(f"{what}: vector {i} has {len(v)} dimensions, expected {dim} "
                                "(set the right dim in the embeddings config, or use a new model name)")
    lens = {len(v) for v in vectors}
    if len(lens) > 1:
        raise EmbedderError(f"{what}: vectors of different sizes {sorted(lens)} in one reply")
    try:
        mat = np.array(vectors, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise EmbedderError(f"{what}: a vector contains something that is not a number") from exc
    if mat.dtype == object or mat.ndim != 2:
        raise EmbedderError(f"{what}: malformed vectors")
    return normalise_rows(mat, what=what)


class _RemoteEmbedder:
    provider = ""
    default_base = ""
    default_model = ""
    _strip_v1 = False

    def __init__(self, model: str | None = None, *, api_base: str | None = None, api_key: str | None = None,
                 timeout_s: float = 10.0, dim: int | None = None, batch_size: int = 128):
        self.model = model or self.default_model
        if not isinstance(self.model, str) or not self.model.strip():
            raise EmbedderError(f"{self.provider} embedder: model must be a non-empty string")
        if dim is not None and (not isinstance(dim, int) or isinstance(dim, bool) or dim <= 0):
            raise EmbedderError(f"{self.provider} embedder: dim must be a positive integer, got {dim!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise EmbedderError(f"{self.provider} embedder: batch_size must be >= 1")
        self.api_base = (api_base or self.default_base).rstrip("/")
        scheme, host, port, self._prefix = _parse_base(self.api_base, strip_v1=self._strip_v1)
        self._http = _HttpJsonClient(f"{self.provider} embeddings", scheme, host, port, timeout_s, api_key)
        self.timeout_s = float(timeout_s)
        self.batch_size = batch_size
        self._dim: int | None = dim if dim is not None else _known_dim(self.model)

    @property
    def store_name(self) -> str:
        return store_name_for(self.provider, self.model)

    @property
    def known_dim(self) -> int | None:
        """The vector size if known without asking the server."""
        return self._dim

    @property
    def dim(self) -> int:
        """The vector size; for a model of unknown size this asks the server once."""
        if self._dim is None:
            self._embed_batch(["dimension probe"])
        assert self._dim is not None
        return self._dim

    def load(self) -> None:
        """Nothing to load here: the model runs behind the API (the first call is a network call)."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        items = check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts = [self._embed_batch(items[i : i + self.batch_size]) for i in range(0, len(items), self.batch_size)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)

    def _embed_batch(self, batch: list[str]) -> np.ndarray:
        vectors = self._request(batch)
        mat = _to_matrix(f"{self.provider} embeddings ({self.model})", vectors, len(batch), self._dim)
        if self._dim is None:
            self._dim = mat.shape[1]
        return mat

    def _request(self, batch: list[str]) -> list:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, api_base={self.api_base!r})"


class OpenAIEmbedder(_RemoteEmbedder):
    """POST {api_base}/v1/embeddings {"model", "input": [...]} -> {"data": [{"embedding", "index"}]}.

    ``api_base`` may be given with or without the trailing ``/v1``. The key goes in an
    ``Authorization: Bearer`` header (omitted when no key is given, for local compatible servers).
    """

    provider = "openai"
    default_base = "https://api.openai.com"
    default_model = "text-embedding-3-small"
    _strip_v1 = True

    def __init__(self, model: str | None = None, *, api_base: str | None = None, api_key: str | None = None,
                 timeout_s: float = 10.0, dim: int | None = None, batch_size: int = 128):
        super().__init__(model, api_base=api_base, api_key=api_key, timeout_s=timeout_s, dim=dim,
                         batch_size=min(batch_size, 2048))
        # text-embedding-3-* can shorten their vectors server-side; ask only when a size is configured
        # that is not the native one (other compatible servers may refuse the field).
        native = _known_dim(self.model)
        self._send_dimensions = (dim is not None and self.model.startswith("text-embedding-3")
                                 and native is not None and dim != native)

    def _request(self, batch: list[str]) -> list:
        body: dict[str, Any] = {"model": self.model, "input": batch}
        if self._send_dimensions:
            body["dimensions"] = self._dim
        reply = self._http.post_json(f"{self._prefix}/v1/embeddings", body)
        data = reply.get("data") if isinstance(reply, dict) else None
        if not isinstance(data, list):
            raise EmbedderError(f"openai embeddings: reply has no 'data' list: {str(reply)[:120]}")
        items = []
        for pos, item in enumerate(data):
            if not isinstance(item, dict) or "embedding" not in item:
                raise EmbedderError(f"openai embeddings: data[{pos}] has no 'embedding'")
            idx = item.get("index", pos)
            if not isinstance(idx, int) or isinstance(idx, bool):
                raise EmbedderError(f"openai embeddings: data[{pos}] has a bad index {idx!r}")
            items.append((idx, item["embedding"]))
        items.sort(key=lambda p: p[0])
        if [i for i, _ in items] != list(range(len(batch))):
            raise EmbedderError(f"openai embeddings: expected indexes 0..{len(batch) - 1}, got {[i for i, _ in items][:10]}")
        return [e for _, e in items]


class OllamaEmbedder(_RemoteEmbedder):
    """POST {api_base}/api/embed {"model", "input": [...]} -> {"embeddings": [[...], ...]}."""

    provider = "ollama"
    default_base = "http://127.0.0.1:11434"
    default_model = "nomic-embed-text"

    def _request(self, batch: list[str]) -> list:
        reply = self._http.post_json(f"{self._prefix}/api/embed", {"model": self.model, "input": batch})
        if isinstance(reply, dict) and "error" in reply and "embeddings" not in reply:
            raise EmbedderError(f"ollama embeddings: server error: {str(reply['error'])[:200]}")
        vectors = reply.get("embeddings") if isinstance(reply, dict) else None
        if not isinstance(vectors, list):
            raise EmbedderError(f"ollama embeddings: reply has no 'embeddings' list: {str(reply)[:120]}")
        return vectors
