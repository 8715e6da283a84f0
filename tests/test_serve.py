"""`memmesh serve`: one process holds the home; every other command goes through its control
channel, with the same output, errors and exit codes as in-process; it stops cleanly on a
signal; a dead serve's files are reported and removed; the control socket is the owner's only.

The multi-process tests run real `memmesh` processes (``python -m node.cli``), as a user does.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import pytest
from aiohttp import web
from pydantic import Field

from memmesh.auth.errors import MemmeshError
from memmesh.node import Node
from memmesh.node.cli import main
from memmesh.node.commands import ParamsError, UnknownCommand
from memmesh.node.commands.params import NoParams, Params
from memmesh.node.commands.registry import Registry
from memmesh.node.commands.result import Result
from memmesh.node.control import (
    SERVE_JSON,
    SERVE_SOCK,
    ControlClient,
    RemoteError,
    _UnixConnection,
    lock_holder,
    remote,
)
from memmesh.node.control_server import ControlChannel
from memmesh.node.refusal import failure
from memmesh.node.serve_log import LogFormatter
from memmesh.node.worker import DbThread
from tests.test_cli import mm

CLI = [sys.executable, "-m", "memmesh.node.cli"]
START_TIMEOUT_S = 20.0  # a cold interpreter importing memmesh; usually about a second
HANG_GUARD_S = 60.0  # only so that a hang fails: nothing here asserts how long anything took


class Server:
    """A `memmesh serve` process on a free port, its log in a file."""

    def __init__(self, home: Path, *extra: str) -> None:
        self.home = home
        self.log_path = home.parent / f"serve-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 (serve writes it until stop() closes it)
        self.proc = subprocess.Popen([*CLI, "--home", str(home), "serve", "--listen", "127.0.0.1:0", "--no-discovery",
                                      "--api-listen", "127.0.0.1:0", *extra],
                                     stdout=subprocess.PIPE, stderr=self._log, text=True)
        self.info: dict = {}

    def wait_ready(self) -> Server:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited with {self.proc.returncode}: {self.log()}")
            try:
                self.info = json.loads((self.home / SERVE_JSON).read_text())
                return self
            except (FileNotFoundError, ValueError):
                time.sleep(0.02)
        raise AssertionError(f"serve did not start: {self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


@contextlib.contextmanager
def serving(home: Path, *extra: str) -> Iterator[Server]:
    server = Server(home, *extra)
    try:
        yield server.wait_ready()
    finally:
        server.kill()


def cli(capsys, home: Path, *args: str) -> tuple[int, str, str]:
    """The `memmesh` command's main() run in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main(["--home", str(home), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


# The read commands and refused commands compared between serve and in-process.
READS = [("recall", "alpha", "k"), ("--json", "status"), ("agent", "list"), ("memory", "list")]
REFUSED = [("agent", "new", "alpha"),                      # exists already (the node decides)
           ("recall", "nobody", "k"),                      # no such agent
           ("memory", "grant", "nobank", "alpha", "read"),  # no such bank
           ("recall", "alpha", "k", "--limit", "0"),       # parameters (refused before anything)
           ("tool", "alpha", "remember", '{"key": "k"}')]  # a tool's arguments


def _comparable(command: tuple[str, ...], got: tuple[int, str, str]) -> tuple:
    code, stdout, stderr = got
    if command == ("--json", "status"):
        data = json.loads(stdout)
        # Whether serve runs is what differs: its listeners, uptime and the verify counter of the
        # process that answers, and which recall indexes it has open (status builds none: a
        # bank's recall counts show while its index is open); the node's key and counts are the
        # same either way.
        data.pop("sync", None)
        for field in ("serving", "listeners", "discovery", "uptime_s", "verify", "memory"):
            data["node"].pop(field)
        for db in data["databases"]:
            db.pop("recall")
        return code, data, stderr
    return got


@pytest.mark.slow
def test_commands_go_through_serve_with_the_same_output_and_errors(home, capsys):
    with serving(home) as server:
        pid = server.proc.pid
        assert server.info["pid"] == pid and lock_holder(home) == str(pid)  # serve holds the home
        assert stat.S_IMODE((home / SERVE_SOCK).stat().st_mode) == 0o600
        assert stat.S_ISSOCK((home / SERVE_SOCK).stat().st_mode)
        assert stat.S_IMODE((home / SERVE_JSON).stat().st_mode) == 0o600
        assert server.info["node_key"].startswith("ed25519:")
        assert re.fullmatch(r"127\.0\.0\.1:\d+", server.info["listen"])

        # Writes through main() in this process, then reads as separate processes, as a user runs
        # them. Each goes through serve: serve holds the home's lock the whole time, so a direct
        # open would wait for it and fail (HomeBusy); serve's log has each one's control line.
        for args in (("agent", "new", "alpha"), ("remember", "alpha", "k", "v")):
            assert cli(capsys, home, *args)[0] == 0, args
        ran = {}
        for args, op in ((("recall", "alpha", "k"), "recall"), (("status", "--json"), "status")):
            before = len(re.findall(rf"info control op={op} status=ok ms=", server.log()))
            proc = mm(*args, home=home, check=False)
            assert proc.returncode == 0 and proc.stderr == "", (args, proc.stderr)
            assert len(re.findall(rf"info control op={op} status=ok ms=", server.log())) == before + 1, args
            assert lock_holder(home) == str(pid)  # serve kept the home all along
            ran[args] = proc
        assert "k: v" in ran[("recall", "alpha", "k")].stdout
        status = json.loads(ran[("status", "--json")].stdout)
        assert [d["kind"] for d in status["databases"]] == ["agent"]
        if "sync" in status:
            assert status["sync"]["serving"] is True

        # The same commands through main() in this process: the CLI's own routing, faster.
        through = {c: cli(capsys, home, *c) for c in [*READS, *REFUSED]}
        init = cli(capsys, home, "init")
        assert init[0] == 0 and "already initialised" in init[1]  # init through serve: the node exists
        log = server.log()
        for op in ("agent.new", "remember", "recall", "status", "agent.list", "memory.list", "init"):
            assert re.search(rf"info control op={re.escape(op)} status=ok ms=", log), (op, log)
        assert re.search(r"info control op=agent\.new status=(?!ok)\w+ ms=", log), log  # the refused one
        assert server.stop() == 0

    for command in REFUSED:
        code, stdout, stderr = through[command]
        assert code == 1 and stdout == "" and len(stderr.splitlines()) == 1, (command, stderr)
        assert stderr.startswith("memmesh: error: ") and "Traceback" not in stderr
    direct = {c: cli(capsys, home, *c) for c in [*READS, *REFUSED]}
    for command in [*READS, *REFUSED]:
        assert _comparable(command, through[command]) == _comparable(command, direct[command]), command
    assert ran[("recall", "alpha", "k")].stdout == direct[("recall", "alpha", "k")][1]


@pytest.mark.slow
def test_progress_events_stream_through_serve(home):
    with Node.open(home) as node:
        node.run("agent.new", {"name": "alpha"})
        for i in range(5):
            node.call_tool("alpha", "remember", {"key": f"k{i}", "value": f"value number {i}"})
        node.run("embedder.set", {"provider": "hashed"})
    with serving(home) as server:
        events: list[dict] = []
        client = remote(home)
        assert client is not None and client.pid == server.proc.pid
        with client:
            result = client.run("memory.reindex", {"bank": "alpha"}, events=events.append)
            again = client.run("memory.reindex", {"bank": "alpha"})  # one connection, two commands
            status = client.status()
        assert result.data["embedded"] == 5 and again.data["embedded"] == 0
        assert events and events[-1] == {"event": "progress", "bank": "alpha", "done": 5, "total": 5}
        assert status["serve"]["pid"] == server.proc.pid and isinstance(status["sync"], dict)


def _keys_recalled(home: Path) -> set[str]:
    with Node.open(home) as node:
        out = node.call_tool("alpha", "recall", {"limit": 100})
    return {m["key"] for m in out["memories"]}


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_serve_cleanly_and_keeps_what_was_acknowledged(home, sig):
    with Node.open(home) as node:
        node.run("agent.new", {"name": "alpha"})
    acknowledged: list[str] = []
    errors: list[BaseException] = []

    def writer(stop: threading.Event) -> None:
        client = remote(home)
        assert client is not None
        i = 0
        with client:
            while not stop.is_set():
                try:
                    client.run("remember", {"agent": "alpha", "key": f"m{i}", "value": f"memory {i}"})
                except MemmeshError as exc:  # serve went away mid-command: not acknowledged
                    errors.append(exc)
                    return
                acknowledged.append(f"m{i}")
                i += 1

    with serving(home) as server:
        stop = threading.Event()
        t = threading.Thread(target=writer, args=(stop,))
        t.start()
        deadline = time.monotonic() + 10
        while len(acknowledged) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        rc = server.stop(sig, timeout=HANG_GUARD_S)  # while the writer keeps sending
        stop.set()
        t.join(HANG_GUARD_S)
        log = server.log()
    assert rc == 0, (rc, log)
    assert not t.is_alive()  # the writer was not left hanging on a serve that went away
    assert not (home / SERVE_JSON).exists() and not (home / SERVE_SOCK).exists()
    assert f"stopping signal={signal.Signals(sig).name}" in log and "info stop " in log
    assert len(acknowledged) >= 20
    assert set(acknowledged) <= _keys_recalled(home)  # every acknowledged write is there


@pytest.mark.slow
def test_a_killed_serve_leaves_a_stale_socket_that_the_next_command_reports(home, capsys):
    with Node.open(home) as node:
        node.run("agent.new", {"name": "alpha"})
    with serving(home) as server:
        assert cli(capsys, home, "remember", "alpha", "k", "before the kill")[0] == 0
        pid = server.proc.pid
        server.proc.kill()  # kill -9: no clean-up at all
        server.proc.wait(10)
    assert (home / SERVE_SOCK).exists() and (home / SERVE_JSON).exists()
    proc = mm("recall", "alpha", "k", home=home, check=False)
    assert proc.returncode == 0 and "k: before the kill" in proc.stdout, proc.stderr
    assert proc.stderr.splitlines() == [
        f"memmesh: serve is not running (stale {home / SERVE_SOCK} from pid {pid}); running here"]
    assert not (home / SERVE_SOCK).exists() and not (home / SERVE_JSON).exists()
    assert mm("recall", "alpha", "k", home=home).stderr == ""  # said once


@pytest.mark.slow
def test_a_second_serve_refuses_naming_the_first(home):
    with serving(home) as server:
        proc = subprocess.run([*CLI, "--home", str(home), "serve", "--listen", "127.0.0.1:0"], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 1 and proc.stdout == ""
        assert proc.stderr.splitlines() == [
            f"memmesh: error: serve is already running for {home} (pid {server.proc.pid}, "
            f"listening on {server.info['listen']}); stop it first (kill -TERM {server.proc.pid})"]
        assert server.proc.poll() is None and (home / SERVE_SOCK).exists()  # the first one is untouched


@pytest.mark.slow
def test_serve_says_it_waits_for_a_busy_home_then_starts(home):
    node = Node.open(home)  # a one-shot command holding the home
    server = Server(home)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "waiting up to 30 s" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert f"memmesh: {home} is in use by process {os.getpid()}; waiting up to 30 s" in server.log()
        assert not (home / SERVE_JSON).exists()
        node.close()
        server.wait_ready()
    finally:
        node.close()
        server.kill()


@pytest.mark.slow
def test_serve_refuses_what_it_cannot_do_in_one_line(home):
    busy = socket.create_server(("127.0.0.1", 0))
    try:
        port = busy.getsockname()[1]
        proc = mm("serve", "--listen", f"127.0.0.1:{port}", "--no-discovery", home=home, check=False)
    finally:
        busy.close()
    assert proc.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in proc.stderr.splitlines()[-1]
    assert not (home / SERVE_JSON).exists() and not (home / SERVE_SOCK).exists() and lock_holder(home) is None
    bad = mm("serve", "--listen", "nowhere", home=home, check=False)
    assert bad.returncode == 1 and bad.stderr.splitlines() == [
        "memmesh: error: serve: listen should be HOST:PORT with a port from 0 to 65535 (got 'nowhere')"]
    os.chmod(home, 0o775)
    shared = mm("serve", "--listen", "127.0.0.1:0", "--no-discovery", home=home, check=False)
    assert shared.returncode == 1 and "writable by its group" in shared.stderr and "chmod go-w" in shared.stderr
    assert not (home / SERVE_SOCK).exists()


@pytest.mark.slow
def test_a_home_path_too_long_for_a_unix_socket_still_works(tmp_path, capsys):
    deep = tmp_path.joinpath(*["a-rather-long-directory-name"] * 5) / "node"
    assert len(str(deep / SERVE_SOCK)) > 108
    Node.init(deep)[0].close()
    with serving(deep) as server:
        code, out, _err = cli(capsys, deep, "--json", "status")  # the CLI's client, in this process
        assert code == 0 and json.loads(out)["home"] == str(deep)
        assert "info control op=status status=ok" in server.log()
        assert server.stop() == 0
    assert not (deep / SERVE_SOCK).exists()


@pytest.mark.slow
def test_two_serves_import_and_sync_a_bank_through_their_control_channels(tmp_path):
    """What serve hosts: the sync API on its listen address, the daemon (a commit on one node
    reaches the other soon after), and commands that wait on a peer (import runs on serve's
    loop while the database thread keeps serving)."""
    homes = [tmp_path / "a", tmp_path / "b"]
    for h in homes:
        node, _ = Node.init(h)
        with node:
            node.run("embedder.set", {"provider": "none"})
    with serving(homes[0], "--interval", "1") as a, serving(homes[1], "--interval", "1") as b:
        with remote(homes[0]) as ca, remote(homes[1]) as cb:  # type: ignore[union-attr]
            ca.run("agent.new", {"name": "alpha"})
            ca.run("memory.new", {"name": "notes"})
            ca.run("memory.grant", {"bank": "notes", "agent": "alpha", "perm": "write"})
            ca.run("remember", {"agent": "alpha", "key": "k1", "value": "before the import", "bank": "notes"})
            ticket = ca.run("memory.share", {"bank": "notes", "perm": "admin"}).data["ticket"]
            cb.run("memory.import", {"ticket": ticket, "perm": "admin"})
            cb.run("agent.new", {"name": "beta"})
            cb.run("memory.grant", {"bank": "notes", "agent": "beta", "perm": "read"})
            ca.run("remember", {"agent": "alpha", "key": "k2", "value": "after the import", "bank": "notes"})
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                got = cb.run("tool", {"agent": "beta", "tool": "recall", "args": {"bank": "notes"}}).data
                if {m["key"] for m in got["memories"]} == {"k1", "k2"}:
                    break
                time.sleep(0.1)
            else:
                raise AssertionError(f"k2 did not reach b: {got}\n{a.log()}\n{b.log()}")
        assert re.search(r"info request op=\w+ peer=127\.0\.0\.1 status=200 ms=", a.log()), a.log()
        assert a.stop() == 0 and b.stop() == 0


# ---------------------------------------------------------------------- in-process units
class Wait(Params):
    seconds: Annotated[float, Field(description="how long to wait for the client's go-ahead")] = 5.0


class Custom(MemmeshError):
    pass


@pytest.fixture
def channel(tmp_path):
    """A ControlChannel with test commands on a Unix socket, its loop in a thread."""
    released = threading.Event()
    reg = Registry()

    @reg.command("wait", Wait, "emit an event, then wait until the client has it")
    def wait(node, p: Wait, *, events) -> Result:
        events({"event": "progress", "done": 1, "total": 2})
        got_it = released.wait(p.seconds)  # only if the event reached the client meanwhile
        events({"event": "progress", "done": 2, "total": 2})
        return Result({"streamed": got_it}, "done", ["a warning"])

    for name, exc in {"params": ParamsError("bad: limit should be at least 1 (got 0)"),
                      "missing": FileNotFoundError(2, "No such file or directory", "/no/such/file"),
                      "custom": Custom("a refusal of a type the client may not know"),
                      "bug": ZeroDivisionError("division by zero")}.items():
        def fail(node, p, exc=exc):
            raise exc
        reg.command(name, NoParams, name)(fail)

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    db = DbThread()
    path = tmp_path / SERVE_SOCK
    chan = ControlChannel(object(), db, {"pid": 1}, registry=reg)  # type: ignore[arg-type]

    async def start() -> web.AppRunner:
        runner = web.AppRunner(chan.app())
        await runner.setup()
        await web.UnixSite(runner, str(path)).start()
        return runner

    runner = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    yield (lambda: ControlClient(tmp_path, {"pid": 1}, _UnixConnection(path))), released
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    db.stop()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_events_reach_the_client_while_the_command_runs(channel):
    connect, released = channel
    seen = []

    def sink(event):
        seen.append(event)
        released.set()  # the command waits for this: a buffered stream would time it out

    with connect() as client:
        result = client.run("wait", {"seconds": 5.0}, events=sink)
    assert result.data == {"streamed": True} and result.text == "done" and result.warnings == ["a warning"]
    assert seen == [{"event": "progress", "done": 1, "total": 2}, {"event": "progress", "done": 2, "total": 2}]


def test_refusals_come_back_as_the_same_exception_and_line(channel, caplog):
    connect, _ = channel
    with connect() as client:
        with pytest.raises(ParamsError) as err:
            client.run("params", {})
        assert failure(err.value) == ("bad: limit should be at least 1 (got 0)", 1)
        with pytest.raises(FileNotFoundError) as missing:
            client.run("missing", {})
        assert failure(missing.value) == ("No such file or directory (/no/such/file)", 1)
        assert failure(missing.value) == failure(FileNotFoundError(2, "No such file or directory", "/no/such/file"))
        with pytest.raises(RemoteError) as custom:  # tests.* is not a package the client rebuilds from
            client.run("custom", {})
        assert failure(custom.value) == failure(Custom("a refusal of a type the client may not know"))
        with caplog.at_level(logging.ERROR, logger="memmesh.serve"):
            with pytest.raises(RemoteError, match=r"serve failed running bug: ZeroDivisionError: division by zero"):
                client.run("bug", {})
        assert any(r.exc_info for r in caplog.records)  # the traceback is in serve's log
        with pytest.raises(ParamsError, match="wait does not take colour"):
            client.run("wait", {"colour": 1})
        with pytest.raises(UnknownCommand, match="unknown command 'nope'"):
            client.run("nope", {})
        assert client.run("wait", {"seconds": 0.0}).text == "done"  # the connection still serves


def test_log_lines_are_one_per_event_as_text_or_json():
    record = logging.LogRecord("memmesh.serve", logging.INFO, __file__, 1, "control", (), None)
    record.fields = {"op": "recall", "status": "ok", "ms": 1.5, "note": "two words"}
    text = LogFormatter(False).format(record)
    assert re.fullmatch(r"\S+Z info control op=recall status=ok ms=1.5 note=\"two words\"", text)
    as_json = json.loads(LogFormatter(True).format(record))
    assert as_json["event"] == "control" and as_json["op"] == "recall" and as_json["ms"] == 1.5
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError:
        plain = logging.LogRecord("memmesh.sync", logging.WARNING, __file__, 1, "sync of %s failed", ("x",),
                                  sys.exc_info())
    for fmt in (LogFormatter(False), LogFormatter(True)):
        line = fmt.format(plain)
        assert "\n" not in line and "ZeroDivisionError" in line and "sync of x failed" in line
