"""Bad input at the local interfaces, tried again with new cases: a 4xx (or one line and a
non-zero exit on the CLI) that says what is wrong, never a 500, a traceback, a hang, or a
terminal driven by what a memory holds; and a home another user could swap is never opened.

* HTTP API: an Authorization header that is not UTF-8, a Content-Encoding that does not
  decode, a key named twice in one object, a lone surrogate in any string, NaN and the
  infinities, digits Python calls digits ('²'), a 100,000 character value quoted back, an
  absolute-form request target naming another host, the legitimate spellings of localhost.
* Every transport: parameters nested deeper than the bound are refused before json.dumps
  recurses (MCP and the control channel hand parse() decoded objects).
* CLI: what a memory holds is printed with its control characters escaped.
* Home: owned by another user, a link another user owns, a parent others may write without
  the sticky bit: refused, nothing written; a link of one's own to a private directory opens.
* config check: YAML nested thousands deep, and aliases that expand a billion-laughs way.
* MCP: the prompt's numeric argument given as '²'.
"""
from __future__ import annotations

import asyncio
import gzip
import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from memmesh.node import Node
from memmesh.node.api.app import host_allowed
from memmesh.node.commands import REGISTRY
from memmesh.node.commands.params import MAX_DEPTH, ParamsError, parse
from memmesh.node.listen import parse_listen
from memmesh.node.settings import MAX_YAML_DEPTH, ConfigFileError, parse_config
from tests.homes import api_on
from tests.procs import CLI, Serve

SURROGATE = "\ud800"


# ---------------------------------------------------------------------- the HTTP API, in process
class Api:
    def __init__(self, server: TestServer, token: str, session: aiohttp.ClientSession) -> None:
        self.server, self.token, self.session, self.port = server, token, session, server.port

    async def call(self, path: str, body: Any = None, *, raw: bytes | None = None,
                   headers: dict[str, str] | None = None) -> tuple[int, Any]:
        sent = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json", **(headers or {})}
        data = raw if raw is not None else json.dumps(body).encode()
        async with self.session.post(f"http://127.0.0.1:{self.port}{path}", data=data, headers=sent) as resp:
            return resp.status, await resp.json(content_type=None)

    async def raw(self, request: bytes) -> tuple[int, bytes]:
        """One request written byte for byte (headers aiohttp's client would not send)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(request)
            await writer.drain()
            out = await asyncio.wait_for(reader.read(), 60)  # Connection: close
        finally:
            writer.close()
        head, _, body = out.partition(b"\r\n\r\n")
        return int(head.split()[1]), body


@pytest.fixture
async def api(home) -> AsyncIterator[Api]:
    """The API of conftest's home (no embedder) with agent alpha and bank notes."""
    node = Node.open(home)
    node.run("agent.new", {"name": "alpha"})
    node.run("memory.new", {"name": "notes"})
    async with api_on(node) as (server, token, session):
        yield Api(server, token, session)


def request(api: Api, path: str, body: bytes, *, host: str | None = None, target: str | None = None,
            extra: bytes = b"") -> bytes:
    host = host or f"127.0.0.1:{api.port}"
    return (f"POST {target or path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n").encode() + extra + b"\r\n" + body


async def test_an_authorization_header_that_is_not_utf8_is_401(api):
    for token in (b"\xff\xfe", b"\xc3", b"x\x80y", api.token.encode() + b"\xff"):
        status, body = await api.raw(request(api, "/v1/agents/alpha/tools/recall", b'{"query": "x"}',
                                       extra=b"Authorization: Bearer " + token + b"\r\n"))
        assert status == 401, (token, body)
        assert json.loads(body)["error"]["code"] == "unauthorized"


async def test_a_body_whose_content_encoding_does_not_decode_is_400_and_a_bomb_413(api):
    path = "/v1/agents/alpha/tools/recall"
    auth = f"Authorization: Bearer {api.token}\r\n".encode()
    broken = gzip.compress(b'{"query": "x"}')[:10] + b"\xff" * 40  # a gzip header, then no deflate stream
    for encoding, body in ((b"gzip", b"not gzip at all"), (b"gzip", broken)):
        extra = auth + b"Content-Encoding: " + encoding + b"\r\n"
        status, answer = await api.raw(request(api, path, body, extra=extra))
        error = json.loads(answer)["error"]
        assert status == 400 and error["code"] == "invalid_json", (encoding, status, answer)
        assert error["message"].startswith("the body could not be read: ") and "\n" not in error["message"]
    # A body whose end does not decode is refused by aiohttp's parser itself, before any route.
    status, answer = await api.raw(request(api, path, b"\x00\x01\x02", extra=auth + b"Content-Encoding: deflate\r\n"))
    assert status == 400, answer
    bomb = gzip.compress(b'{"query": "' + b"a" * (20 << 20) + b'"}')  # 20 MiB in about 20 KB
    status, answer = await api.raw(request(api, path, bomb, extra=auth + b"Content-Encoding: gzip\r\n"))
    assert status == 413, answer
    status, answer = await api.raw(request(api, path, gzip.compress(b'{"query": "x"}'),
                                     extra=auth + b"Content-Encoding: gzip\r\n"))
    assert status == 200, answer


async def test_a_key_named_twice_in_one_object_is_400(api):
    for raw in (b'{"key": "k", "value": "v", "key": "other"}',
                b'{"key": "k", "value": "v", "edges": [{"to": "a", "type": "t", "to": "b"}]}'):
        status, answer = await api.call("/v1/agents/alpha/tools/remember", raw=raw)
        assert status == 400 and answer["error"]["code"] == "invalid_json", answer
        assert "appears twice in one object" in answer["error"]["message"]
    status, answer = await api.call("/v1/agents/alpha/tools/recall", {"query": "k"})
    assert status == 200 and answer["data"]["memories"] == []  # nothing was written


async def test_a_lone_surrogate_in_any_string_is_one_clear_400(api):
    calls = [("/v1/agents/alpha/tools/remember", {"key": f"k{SURROGATE}", "value": "v"}),
             ("/v1/agents/alpha/tools/remember", {"key": "k", "value": f"a{SURROGATE}b"}),
             ("/v1/agents/alpha/tools/remember", {"key": "k", "value": "v", "tags": ["\udfff"]}),
             ("/v1/agents/alpha/tools/recall", {"query": SURROGATE}),
             ("/v1/agents/alpha/tools/recall", {"query": "x", "bank": f"notes{SURROGATE}"}),
             ("/v1/memory/new", {"name": f"n{SURROGATE}"}),
             ("/v1/agents/alpha/command", {"line": f"/memory new x{SURROGATE}"}),
             ("/v1/config/check", {"text": f"sync:\n  fanout: {SURROGATE}\n"}),
             ("/v1/agents/alpha/tools/remember", {"key": "k", "value": "v", SURROGATE: 1})]
    for path, body in calls:
        # json.dumps writes the surrogate as the escape \ud800, the only way JSON can carry one.
        status, answer = await api.call(path, body)
        assert status == 400 and answer["error"]["code"] == "invalid_params", (path, status, answer)
        message = answer["error"]["message"]
        assert "a lone surrogate, which is not text" in message and "Invalid JSON" not in message, (path, message)
    status, answer = await api.call("/v1/agents/alpha/tools/recall", {"query": "k"})
    assert answer["data"]["memories"] == []


async def test_a_number_python_calls_a_digit_is_a_4xx_not_a_500(api):
    # str.isdigit() accepts '²' and '①', which int() refuses; int() refuses 5,000 digits.
    for key in ("max_entries", "auto_recall_deadline_ms"):
        for value in ("²", "①", "9" * 5000):
            for path, body in (("/v1/memory/config", {"agent": "alpha", "action": "set", "key": key, "value": value}),
                               ("/v1/agents/alpha/command", {"line": f"/memory config set {key} {value}"})):
                status, answer = await api.call(path, body)
                assert 400 <= status < 500, (path, key, value[:5], status, answer)
                assert len(answer["error"]["message"]) <= 1000
    for listen in ("127.0.0.1:²", "127.0.0.1:" + "9" * 5000):
        with pytest.raises(ValueError, match="with a port from 0 to 65535"):
            parse_listen(listen)


async def test_a_refusal_that_quotes_a_huge_value_is_one_bounded_line(api):
    for path, body in (("/v1/memory/new", {"name": "a" * 100_000}),
                       ("/v1/agents/alpha/command", {"line": "/memory new " + "b" * 100_000})):
        status, answer = await api.call(path, body)
        message = answer["error"]["message"]
        assert 400 <= status < 500 and len(message) <= 1000 and "\n" not in message, (status, len(message))
        assert "..." in message


def test_non_finite_numbers_are_refused_by_every_float_field():
    embedder = REGISTRY.get("embedder.set").params
    for value in (float("inf"), float("-inf"), float("nan")):
        with pytest.raises(ParamsError, match="timeout_s"):
            parse(embedder, {"provider": "ollama", "timeout_s": value}, "embedder.set")


def test_parameters_nested_past_the_bound_are_refused_on_every_transport():
    # MCP and the control channel hand parse() objects already decoded: json.dumps would recurse.
    deep: Any = "x"
    for _ in range(100_000):
        deep = [deep]
    remember = REGISTRY.get("tool").params
    with pytest.raises(ParamsError, match=f"more than {MAX_DEPTH} deep"):
        parse(remember, {"agent": "alpha", "tool": "recall", "args": {"query": deep}}, "tool")


# ---------------------------------------------------------------------- the Host header
def test_the_host_check_is_strict_and_takes_every_spelling_of_this_address():
    v4, v6 = ("127.0.0.1", 7412), ("::1", 7412, 0, 0)
    # Any port: a port forward (ssh -L 9000:127.0.0.1:7412) or a local proxy names its own.
    for host in ("localhost:7412", "LOCALHOST:7412", "localhost.:7412", "127.0.0.1:7412", "[::1]:7412",
                 "[0:0:0:0:0:0:0:1]:7412", "[::ffff:127.0.0.1]:7412", "[::FFFF:7f00:1]:7412",
                 "127.0.0.1:7413", "localhost:9000", "localhost", "127.0.0.1", "[::1]"):
        assert host_allowed(host, v4) and host_allowed(host, v6), host
    for host in ("a@127.0.0.1:7412", "127.1:7412", "2130706433:7412",
                 "127.000.0.1:7412", "[127.0.0.1]:7412", "::1:7412", "[::1%lo]:7412", "localhost..:7412",
                 "127.0.0.1.:7412", "127.0.0.2:7412", "[::2]:7412", "evil.example:7412", "127.0.0.1:7412, evil",
                 "127.0.0.1:+7412", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:٧٤١٢", ""):
        assert not host_allowed(host, v4) and not host_allowed(host, v6), host


async def test_an_absolute_request_target_must_name_this_api_too(api):
    path = "/v1/agents/alpha/tools/recall"
    auth = f"Authorization: Bearer {api.token}\r\n".encode()
    body = b'{"query": "x"}'
    status, answer = await api.raw(request(api, path, body, target=f"http://evil.example{path}", extra=auth))
    assert status == 421 and json.loads(answer)["error"]["code"] == "misdirected_request"
    status, _ = await api.raw(request(api, path, b'{"query": "x"}', host="evil.example",
                                target=f"http://127.0.0.1:{api.port}{path}", extra=auth))
    assert status == 421
    status, _ = await api.raw(request(api, path, body, target=f"http://localhost:{api.port}{path}", extra=auth))
    assert status == 200


# ---------------------------------------------------------------------- config check
async def test_yaml_nested_thousands_deep_is_a_422_not_a_500(api):
    for text in ("a: " + "[" * 5000 + "]" * 5000, "a: " + "{x: " * 3000 + "1" + "}" * 3000,
                 "a: " + "[" * 200 + "]" * 200, "".join("  " * i + f"k{i}:\n" for i in range(100))):
        status, answer = await api.call("/v1/config/check", {"text": text})
        assert status == 422 and answer["error"]["code"] == "refused", (status, answer)
        assert f"deeper than {MAX_YAML_DEPTH} levels" in answer["error"]["message"]


def laughs(levels: int, width: int = 9) -> str:
    out = f"[&l0 [{', '.join(['lol'] * width)}]"
    for i in range(1, levels):
        out += f", &l{i} [{', '.join([f'*l{i - 1}'] * width)}]"
    return out + "]"


def test_aliases_that_expand_past_the_bound_are_refused_before_they_expand():
    # Seven levels of nine: 4.8 million values from 400 bytes (nine levels: 387 million, which
    # held serve for minutes and 15 GB before this bound).
    for where in ("auto_recall:\n  trust_weights: {}\n", "sync:\n  peers: {}\n", "agents: {}\n", "x: {}\n"):
        with pytest.raises(ConfigFileError, match="aliases expand to more than") as refused:
            parse_config(where.format(laughs(7)), "the given config")
        assert len(str(refused.value)) < 200
    cfg = parse_config("agents:\n  - name: a\n    allowed_tools: &t [recall, remember]\n"
                       "  - name: b\n    allowed_tools: *t\n", "the given config")  # a plain alias is fine
    assert [a.allowed_tools for a in cfg.agents] == [["recall", "remember"]] * 2


# ---------------------------------------------------------------------- the CLI
def test_the_cli_prints_what_a_memory_holds_with_control_characters_escaped(tmp_path):
    home = tmp_path / "home"
    with Node.open(home) as node:
        node.run("embedder.set", {"provider": "none"})
        node.run("agent.new", {"name": "alpha"})
        node.call_tool("alpha", "remember", {"key": "term\x1b[2J", "value": "red \x1b[31mRED\x1b]0;owned\x07 \r\x9b1m"})
    for args in (["recall", "alpha", "red"], ["--json", "recall", "alpha", "red"]):
        done = subprocess.run([*CLI, "--home", str(home), *args], capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        for raw in (b"\x1b", b"\x07", b"\r", "\x9b".encode()):
            assert raw not in done.stdout, (args, raw, done.stdout)
    assert b"\\x1b[31mRED" in subprocess.run([*CLI, "--home", str(home), "recall", "alpha", "red"],
                                             capture_output=True, timeout=60).stdout


def test_a_cli_refusal_quoting_a_huge_or_control_laden_value_is_one_line(tmp_path):
    home = tmp_path / "home"
    Node.open(home).close()
    for name in ("a" * 100_000, "x\x1b[2Ky", "-" * 10 + "json"):
        done = subprocess.run([*CLI, "--home", str(home), "memory", "new", "--", name], capture_output=True,
                              timeout=60)
        lines = done.stderr.splitlines()
        assert done.returncode == 1 and len(lines) == 1 and len(lines[0]) <= 1100, (name[:12], done.stderr[:300])
        assert b"\x1b" not in done.stderr and b"Traceback" not in done.stderr


def test_a_cli_json_option_is_read_by_the_apis_rules_in_one_line(tmp_path):
    home = tmp_path / "home"
    with Node.open(home) as node:
        node.run("agent.new", {"name": "alpha"})
    for edge, says in (("[" * 5000 + "]" * 5000, "more than 64 deep"),
                       ('{"to": "x", "type": "t", "to": "y"}', "appears twice in one object"),
                       ("NaN", "NaN is not a JSON number")):
        done = subprocess.run([*CLI, "--home", str(home), "remember", "alpha", "k", "v", "--edge", edge],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and says in done.stderr and "Traceback" not in done.stderr, done.stderr[-500:]
        assert len(done.stderr.splitlines()) == 1


def test_a_file_the_cli_reads_for_a_parameter_is_read_up_to_its_bound(tmp_path):
    home = tmp_path / "home"
    Node.open(home).close()
    big = tmp_path / "big.yaml"
    big.write_text("# " + "a" * (2 << 20) + "\n")
    for path in (str(big), "/dev/zero"):  # /dev/zero was read until memory ran out
        done = subprocess.run([*CLI, "--home", str(home), "config", "check", path], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 1 and "is larger than 1,048,576 bytes" in done.stderr, done.stderr[-300:]
        assert len(done.stderr.splitlines()) == 1


# ---------------------------------------------------------------------- whose home it is
def as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory or a link to another user (chown)")


def test_a_home_another_user_owns_is_refused_and_nothing_is_written(tmp_path):
    as_root()
    home = tmp_path / "theirs"
    home.mkdir(mode=0o755)
    os.chown(home, 65534, 65534)  # made beforehand by someone else, in a directory both can write
    done = subprocess.run([*CLI, "--home", str(home), "init"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "is owned by" in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert list(home.iterdir()) == []


def test_a_link_another_user_owns_is_refused_and_a_link_of_ones_own_opens(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    mine = tmp_path / "mine"
    mine.symlink_to(real)
    done = subprocess.run(["sh", "-c", 'umask 000 && exec "$@"', "sh", *CLI, "--home", str(mine), "init"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(os.stat(real).st_mode) == 0o700 and (real / "keys" / "peer.key").exists()
    assert subprocess.run([*CLI, "--home", str(mine), "status"], capture_output=True, timeout=60).returncode == 0
    as_root()
    theirs = tmp_path / "theirs"
    theirs.symlink_to(real)
    os.chown(theirs, 65534, 65534, follow_symlinks=False)
    done = subprocess.run([*CLI, "--home", str(theirs), "status"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "symbolic link owned by" in done.stderr, done.stderr


def test_a_home_in_a_directory_others_may_write_without_the_sticky_bit_is_refused_first():
    shared = Path(tempfile.mkdtemp(prefix="memmesh-shared-", dir="/tmp"))
    try:
        os.chmod(shared, 0o777)
        done = subprocess.run([*CLI, "--home", str(shared / "h"), "init"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and "which other users may write" in done.stderr, done.stderr
        assert not (shared / "h").exists()
        os.chmod(shared, 0o1777)  # /tmp's own mode: others cannot rename what is not theirs
        done = subprocess.run([*CLI, "--home", str(shared / "h"), "init"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# ---------------------------------------------------------------------- MCP
@pytest.mark.slow
async def test_the_prompts_number_argument_spelt_with_unicode_digits_is_the_registry_line(tmp_path):
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    from memmesh.node.mcp_server import PROMPT, build_server

    home = tmp_path / "node"
    with Node.open(home) as node:
        node.run("embedder.set", {"provider": "none"})
        node.run("agent.new", {"name": "alpha"})
    (home / "config.yaml").write_text("sync:\n  listen: \"127.0.0.1:0\"\n  discovery: false\n"
                                      "api:\n  listen: \"127.0.0.1:0\"\n")
    serve = Serve(home).start()
    try:
        serve.wait_ready()
        async with Client(build_server(home, "alpha")) as client:
            for window in ("²", "①", "9" * 5000):
                with pytest.raises(MCPError) as refused:
                    await client.get_prompt(PROMPT, {"messages": "hello", "context_window": window})
                assert "context_window should be a valid integer" in str(refused.value), str(refused.value)[:200]
    finally:
        serve.stop()


async def test_the_mcp_http_door_applies_the_apis_host_rule_before_the_token():
    from memmesh.node.mcp_server import BearerGuard

    reached: list[str] = []

    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        reached.append(scope["headers"][0][1].decode())

    async def answer(host: bytes | list[bytes], token: bytes = b"tok") -> int:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        hosts = host if isinstance(host, list) else [host]
        scope = {"type": "http", "server": ("127.0.0.1", 7413),
                 "headers": [*((b"host", h) for h in hosts), (b"authorization", b"Bearer " + token)]}
        await BearerGuard(inner, "tok")(scope, None, send)
        return sent[0]["status"] if sent else 200

    # The SDK's own check takes "127.0.0.1:*" as a prefix: these passed it.
    for host in (b"127.0.0.1:7413@evil.example", b"127.0.0.1:7413/x", b"127.0.0.2:7413", b"evil.example:7413",
                 [b"127.0.0.1:7413", b"evil.example:7413"], []):
        assert await answer(host) == 421, host
        assert await answer(host, b"wrong") == 421, host  # before the token is looked at
    assert reached == []
    for host in (b"127.0.0.1:7413", b"localhost:7413", b"[::1]:7413", b"127.0.0.1:9000"):  # a port forward's
        assert await answer(host) == 200 and reached[-1] == host.decode()
        assert await answer(host, b"wrong") == 401


async def test_a_chat_line_over_its_bound_is_refused_before_it_is_split(api):
    # shlex's cost grows with the square of a word's length: 900 KB held the database thread 8 s.
    status, answer = await api.call("/v1/agents/alpha/command", {"line": "/memory help " + "x" * 900_000})
    assert status == 400 and answer["error"]["code"] == "invalid_params", answer
    assert "line" in answer["error"]["message"] and "16384" in answer["error"]["message"]
    status, answer = await api.call("/v1/agents/alpha/command", {"line": "/memory new " + "y" * 300})
    # a long line under the bound is parsed and refused for what it says: a name over 64 characters
    assert status == 400 and "name should be 1-64" in answer["error"]["message"], answer
