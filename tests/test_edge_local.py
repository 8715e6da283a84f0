"""What another local user, a web page and bad input can do to a node on this machine: nothing.

* A home is its user's alone: directories 0700, files 0600 (SQLite's -wal and -shm too),
  whatever the umask and whether the directory existed; init and serve make an old home
  private and say so in one line; a second Unix user cannot read node.sqlite or api.token.
* The MCP HTTP transport needs the node's API token, like the HTTP API.
* `config check` over the API never opens a path a request gives, and quotes at most the
  offending YAML token.
* The HTTP API answers only a Host header that names it (DNS rebinding), on every route.
* A control character in a name, or JSON nested 100,000 deep, is a 4xx with one line.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from memmesh.node import Node
from memmesh.node.api.app import MAX_JSON_DEPTH
from memmesh.node.api_token import TOKEN_FILE, read_token
from tests.homes import api_on
from tests.procs import CLI, Serve, until

NUL_BANK = "no\x00tes"


def modes(home: Path) -> dict[str, int]:
    """Every file and directory of ``home`` (the home itself as '.') and its permission bits."""
    out = {".": stat.S_IMODE(os.lstat(home).st_mode)}
    for root, dirs, files in os.walk(home):
        for name in dirs + files:
            path = Path(root) / name
            out[path.relative_to(home).as_posix()] = stat.S_IMODE(os.lstat(path).st_mode)
    return out


def assert_private(home: Path) -> None:
    wrong = {name: f"{mode:o}" for name, mode in modes(home).items()
             if mode != (0o700 if (home / name).is_dir() else 0o600)}
    assert not wrong, f"not private: {wrong}"


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def open_dir(umask_022: None) -> Iterator[Path]:
    """A directory every user can enter (unlike pytest's own 0700 tmp_path), as a home's parent
    usually is; the home is made in it with mkdir -m 755."""
    base = Path(tempfile.mkdtemp(prefix="memmesh-edge-", dir="/tmp"))
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def filled_home(home: Path) -> None:
    """init in an existing 0755 directory, an agent, a bank, a few memories: storage, -wal, -shm."""
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    node, _ = Node.init(home)
    with node:
        node.run("embedder.set", {"provider": "none"})
        node.run("agent.new", {"name": "alpha"})
        node.run("memory.new", {"name": "notes"})
        node.run("memory.grant", {"bank": "notes", "agent": "alpha", "perm": "write"})
        for i in range(3):
            node.call_tool("alpha", "remember", {"key": f"k{i}", "value": f"the secret number {i}", "bank": "notes"})
        assert (home / "node.sqlite-wal").exists() and (home / "node.sqlite-shm").exists()
        assert_private(home)  # while the node is open: -wal and -shm as SQLite made them


# ---------------------------------------------------------------------- the home's modes
@pytest.mark.slow
def test_a_home_is_private_under_umask_022_after_init_writes_and_serve(open_dir):
    home = open_dir / "home"
    filled_home(home)
    assert_private(home)
    (home / "config.yaml").write_text("sync:\n  discovery: false\n")  # the user's own edit, 0644
    serve = Serve(home).start()
    try:
        serve.wait_ready()
        serve.run("tool", {"agent": "alpha", "tool": "remember",
                           "args": {"key": "served", "value": "written by serve", "bank": "notes"}})
        assert_private(home)  # serve.json, serve.sock, -wal, -shm while it runs
        assert "home.private" in serve.log() and "config.yaml (644)" in serve.log()
    finally:
        assert serve.stop() == 0
    assert_private(home)


def _other_user() -> Iterator[pwd.struct_passwd]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second Unix user (useradd) and act as it (setpriv)")
    if not (shutil.which("useradd") and shutil.which("userdel") and shutil.which("setpriv")):
        pytest.skip("needs useradd, userdel and setpriv")
    name = f"mmprobe{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                   capture_output=True, timeout=30)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=30)


@pytest.fixture
def other_user() -> Iterator[pwd.struct_passwd]:
    yield from _other_user()


def test_a_second_unix_user_cannot_read_the_home(open_dir, other_user):
    home = open_dir / "home"
    filled_home(home)

    def read_as_other(path: Path) -> subprocess.CompletedProcess:
        return subprocess.run(["setpriv", f"--reuid={other_user.pw_uid}", f"--regid={other_user.pw_gid}",
                               "--clear-groups", "cat", str(path)], capture_output=True, timeout=30)

    (open_dir / "probe.txt").write_text("x")
    probe = read_as_other(open_dir / "probe.txt")
    assert probe.returncode == 0, probe  # the user can read what is open to it: the refusals below are the modes
    with Node.open(home) as node:  # open, written to: the -wal and -shm files exist
        node.call_tool("alpha", "remember", {"key": "more", "value": "the secret number 9", "bank": "notes"})
        for name in ("node.sqlite", "node.sqlite-wal", "node.sqlite-shm", TOKEN_FILE, "keys/peer.key"):
            assert (home / name).exists(), name
            seen = read_as_other(home / name)
            assert seen.returncode != 0 and b"Permission denied" in seen.stderr, (name, seen)
            assert b"secret number" not in seen.stdout


def test_init_makes_an_old_home_private_in_one_line_and_refuses_a_readable_secret(tmp_path):
    home = tmp_path / "home"
    with Node.open(home) as node:
        node.run("agent.new", {"name": "alpha"})
    os.chmod(home, 0o755)
    os.chmod(home / "node.sqlite", 0o644)
    os.chmod(home / "keys", 0o755)
    (home / "notes.txt").write_text("left here")
    os.chmod(home / "notes.txt", 0o644)
    done = subprocess.run([*CLI, "--home", str(home), "init"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    line = [x for x in done.stdout.splitlines() if x.startswith("made ")]
    assert len(line) == 1 and f"made {home} private" in line[0] and "node.sqlite (644)" in line[0], done.stdout
    assert_private(home)
    again = subprocess.run([*CLI, "--home", str(home), "init"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "made " not in again.stdout  # nothing more to fix
    os.chmod(home / TOKEN_FILE, 0o644)  # a secret others could read may be copied already: refused
    refused = subprocess.run([*CLI, "--home", str(home), "init"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and refused.stderr.splitlines() == [
        f"memmesh: error: API token file {home / TOKEN_FILE} is readable by other users (mode 644); "
        f"run: chmod 600 {home / TOKEN_FILE}"]
    os.chmod(home / TOKEN_FILE, 0o600)
    os.chmod(home, 0o777)  # others could have replaced what it holds: no chmod undoes that
    shared = subprocess.run([*CLI, "--home", str(home), "init"], capture_output=True, text=True, timeout=60)
    assert shared.returncode == 1 and "writable by group and others" in shared.stderr \
        and f"chmod go-w {home}" in shared.stderr and len(shared.stderr.splitlines()) == 1


# ---------------------------------------------------------------------- the HTTP API
class Api:
    def __init__(self, server: TestServer, token: str, session: aiohttp.ClientSession) -> None:
        self.server, self.token, self.session = server, token, session
        self.port = server.port

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def call(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
                   host: str | None = None, token: bool = True) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.token}"} if token else {}
        if host is not None:
            headers["Host"] = host
        if raw is not None or body is not None:
            headers["Content-Type"] = "application/json"
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        async with self.session.request(method, self.url(path), data=data, headers=headers) as resp:
            if resp.content_type == "application/json":
                return resp.status, await resp.json()
            return resp.status, None  # the page's files, the event stream, metrics: the status is enough


@pytest.fixture
async def api(home) -> AsyncIterator[Api]:
    """The API of conftest's home (no embedder) with agent alpha and bank notes."""
    node = Node.open(home)
    node.run("agent.new", {"name": "alpha"})
    node.run("memory.new", {"name": "notes"})
    node.run("memory.grant", {"bank": "notes", "agent": "alpha", "perm": "write"})
    (home / "config.yaml").write_text("sync:\n  fanout: 2\n")
    async with api_on(node) as (server, token, session):
        yield Api(server, token, session)


PUBLIC_AND_PRIVATE = [("GET", "/"), ("GET", "/ui/app.js"), ("GET", "/v1/openapi.json"), ("GET", "/v1/health"),
                      ("GET", "/v1/events"), ("GET", "/metrics"), ("GET", "/v1/status"),
                      ("POST", "/v1/agents/alpha/tools/recall")]


async def test_a_foreign_host_header_is_421_on_every_route_and_localhost_forms_answer(api):
    port = api.port
    for method, path in PUBLIC_AND_PRIVATE:
        body = {"query": "x"} if method == "POST" else None
        for foreign in (f"attacker.example:{port}", "attacker.example", f"127.0.0.2:{port}", f"10.0.0.1:{port}"):
            status, answer = await api.call(method, path, body, host=foreign)
            assert status == 421, (method, path, foreign, status)
            assert answer["error"]["code"] == "misdirected_request", answer
            assert "does not name this API" in answer["error"]["message"]
        if path == "/v1/events":
            continue  # a stream: its answer to a right Host is checked by tests/test_events.py
        for local in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}",
                      f"127.0.0.1:{port + 1}"):  # a port forward names its own port
            status, _ = await api.call(method, path, body, host=local)
            assert status == 200, (method, path, local, status)


async def test_config_check_never_opens_a_path_a_request_gives(api, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("root:$6$saltsaltsalt$hashhashhashhashhashhash:19000:0:99999:7:::\n")
    status, answer = await api.call("POST", "/v1/config/check", {"file": str(secret)})
    assert status == 400 and answer["error"]["code"] == "invalid_params"
    assert "does not take file" in answer["error"]["message"] and "saltsalt" not in json.dumps(answer)
    status, answer = await api.call("POST", "/v1/config/check", {})  # the home's own config.yaml
    assert status == 200 and answer["data"]["ok"] and answer["text"].endswith("fanout 2)")
    status, answer = await api.call("POST", "/v1/config/check", {"text": "sync:\n  fanout: 3\n"})
    assert status == 200 and answer["text"].startswith("the given config: ok") and "fanout 3" in answer["text"]
    # A file's text pasted: the error quotes at most its offending token, cut at 40 characters.
    status, answer = await api.call("POST", "/v1/config/check", {"text": secret.read_text()})
    assert status == 422 and "hashhash:19000" not in answer["error"]["message"], answer
    status, answer = await api.call("POST", "/v1/config/check", {"text": "just some words of a file\n"})
    assert status == 422 and "words" not in answer["error"]["message"], answer  # not a mapping: none of it
    # A wrong value: at most the offending token, bounded.
    long = "A" * 200
    status, answer = await api.call("POST", "/v1/config/check", {"text": f"sync:\n  listen: {long}\n"})
    message = answer["error"]["message"]
    assert status == 422 and message.startswith("the given config:2: sync.listen") and "A" * 41 not in message


def test_the_cli_reads_the_file_it_names_and_sends_its_text(tmp_path):
    home = tmp_path / "home"
    Node.open(home).close()
    mine = tmp_path / "mine.yaml"
    mine.write_text("sync:\n  fanout: 4\n")
    done = subprocess.run([*CLI, "--home", str(home), "config", "check", str(mine)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith(f"{mine}: ok") and "fanout 4" in done.stdout


async def test_a_control_character_in_a_name_is_a_400_on_every_path(api):
    calls = [("/v1/agents/alpha/tools/recall", {"query": "x", "bank": NUL_BANK}),
             ("/v1/agents/alpha/tools/remember", {"key": "k", "value": "v", "bank": NUL_BANK}),
             ("/v1/agents/alpha/tools/neighbors", {"key": "k", "bank": NUL_BANK}),
             ("/v1/agents/al%00pha/tools/recall", {"query": "x"}),
             ("/v1/agents/al%1Bpha/tools/list_memory_banks", {}),
             ("/v1/memory/stats", {"bank": NUL_BANK}),
             ("/v1/memory/delete", {"ref": NUL_BANK}),
             ("/v1/memory/attach", {"bank": NUL_BANK, "agent": "alpha"}),
             ("/v1/retention/show", {"db": NUL_BANK}),
             ("/v1/agents/alpha/command", {"line": f"/memory attach {NUL_BANK}"})]
    for path, body in calls:
        status, answer = await api.call("POST", path, body)
        assert status == 400, (path, status, answer)
        assert "must not contain control characters" in answer["error"]["message"], (path, answer)
        assert "\x00" not in answer["error"]["message"] and "\n" not in answer["error"]["message"]


async def test_json_nested_100000_deep_is_a_400(api):
    for raw in (b"[" * 100_000 + b"]" * 100_000,
                b'{"query": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                b'{"query": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001):
        status, answer = await api.call("POST", "/v1/agents/alpha/tools/recall", raw=raw)
        assert status == 400 and answer["error"]["code"] == "invalid_json", (status, answer)
        assert f"more than {MAX_JSON_DEPTH} deep" in answer["error"]["message"]
    # Brackets inside strings are text, not nesting.
    status, answer = await api.call("POST", "/v1/agents/alpha/tools/recall",
                                    raw=json.dumps({"query": "[" * 1000}).encode())
    assert status == 200, answer


# ---------------------------------------------------------------------- MCP over HTTP
@pytest.mark.slow
async def test_mcp_over_http_needs_the_token_and_refuses_bad_names(tmp_path):
    from mcp import Client

    from tests.test_mcp import authorized, make_home

    home = make_home(tmp_path / "node")
    serve = Serve(home).start()
    log = open(tmp_path / "mcp.err", "w")  # noqa: SIM115 (the MCP process writes it; closed in finally)
    proc = None
    try:
        serve.wait_ready()
        proc = subprocess.Popen([*CLI, "--home", str(home), "mcp", "--agent", "alpha", "--http",
                                 "--listen", "127.0.0.1:0"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=log)

        def url() -> str | None:
            assert proc.poll() is None, (tmp_path / "mcp.err").read_text()
            lines = [x for x in (tmp_path / "mcp.err").read_text().splitlines() if "Streamable HTTP" in x]
            return lines[0].split(" at ", 1)[1].split()[0] if lines else None
        address = until(url, 30, "memmesh mcp --http to listen")
        hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                            "clientInfo": {"name": "probe", "version": "0"}}}
        headers = {"Accept": "application/json, text/event-stream"}
        async with aiohttp.ClientSession() as s:
            for auth in ({}, {"Authorization": "Bearer not-the-token"}, {"Authorization": "Basic eDp5"}):
                async with s.post(address, json=hello, headers={**headers, **auth}) as resp:
                    assert resp.status == 401, auth
                    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
                    assert (await resp.json())["error"]["code"] == "unauthorized"
            token = {"Authorization": f"Bearer {read_token(home)}"}
            deep = b"[" * 100_000 + b"]" * 100_000
            async with s.post(address, data=deep, headers={**headers, **token, "Content-Type": "application/json"}
                              ) as resp:
                assert 400 <= resp.status < 500, resp.status
            async with s.post(address, json=hello, headers={**headers, **token, "Host": "attacker.example:80"}
                              ) as resp:
                assert resp.status == 421
        async with Client(authorized(address, home)) as client:
            done = await client.call_tool("remember", {"key": "over http", "value": "with the token", "bank": "notes"})
            assert not done.is_error
            for tool, args in (("recall", {"query": "token", "bank": NUL_BANK}),
                               ("remember", {"key": "k", "value": "v", "bank": NUL_BANK})):
                refused = await client.call_tool(tool, args)
                assert refused.is_error and "bank must not contain control characters" in refused.content[0].text
        found = serve.run("recall", {"agent": "alpha", "query": "token", "bank": "notes"}).data["memories"]
        assert found[0]["key"] == "over http"
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(20)
        log.close()
        serve.stop()
    assert "Traceback" not in (tmp_path / "mcp.err").read_text()
