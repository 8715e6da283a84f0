"""The node's embedder: embedder.set, embedder.show."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, SecretStr

from memmesh.node.commands.params import Cli, NoParams, Params, not_blank
from memmesh.node.commands.registry import REGISTRY, command
from memmesh.node.commands.result import Result
from memmesh.node.memory.embedders import PROVIDERS, EmbedderConfig
from memmesh.node.registry import EMBEDDER_SECRET

if TYPE_CHECKING:
    from memmesh.node.library import Node

REGISTRY.group("embedder", "choose the embedder used for semantic recall")

NO_EMBEDDER = "embedder: none (recall ranks by BM25 only)"


class EmbedderSet(Params):
    provider: Annotated[Literal[PROVIDERS], Cli(positional=True), Field(  # type: ignore[valid-type]
        description="none (BM25 only), hashed, local (ONNX, offline), openai or ollama")]
    model: Annotated[str | None, not_blank(256), Field(description="the provider's model; default: its usual one")] = None
    api_base: Annotated[str | None, Field(description="the service's base URL (openai, ollama)")] = None
    api_key: Annotated[SecretStr | None, Cli(flag="--api-key-env", metavar="VAR", env=True), Field(
        description="the service's API key, stored peer-local and never synced "
                    "(on the command line: the environment variable that holds it)")] = None
    timeout_s: Annotated[float | None, Cli(flag="--timeout"), Field(
        gt=0, le=600, description="seconds one request may take (default 10)")] = None
    dim: Annotated[int | None, Field(ge=1, le=65536, description=(
        "the vectors' size, when the model's is not known (hashed: 16-65536)"))] = None


@command("embedder.set", EmbedderSet, "set the node's embedder")
def embedder_set(node: Node, p: EmbedderSet) -> Result:
    cfg = EmbedderConfig(p.provider, model=p.model, api_base=p.api_base,
                         timeout_s=p.timeout_s if p.timeout_s is not None else 10.0, dim=p.dim)
    api_key = p.api_key.get_secret_value() if p.api_key is not None else None
    embedder = node.set_embedder_config(cfg, api_key=api_key)
    if embedder is None:
        return Result({"provider": "none"}, NO_EMBEDDER)
    data = {"provider": embedder.provider, "model": embedder.model, "dim": embedder.dim, "store": embedder.store_name}
    return Result(data, f"embedder: {embedder.provider}/{embedder.model} ({embedder.dim} dimensions)\n"
                        f"vectors are stored under {embedder.store_name}; "
                        "`memmesh memory reindex` backfills older memories")


@command("embedder.show", NoParams, "show the node's embedder", read_only=True)
def embedder_show(node: Node, p: NoParams) -> Result:
    cfg = node.embedder_config()
    embedder = node.memory.embedder
    data = {"provider": cfg.provider, "model": embedder.model if embedder else cfg.model,
            "api_base": cfg.api_base, "dim": embedder.dim if embedder else cfg.dim,
            "store": embedder.store_name if embedder else None,
            "api_key_set": node.registry.secret(EMBEDDER_SECRET) is not None}
    if embedder is None:
        return Result(data, NO_EMBEDDER)
    text = f"embedder: {embedder.provider}/{embedder.model} ({embedder.dim} dimensions)"
    if cfg.api_base:
        text += f"\napi base: {cfg.api_base}"
    return Result(data, text)
