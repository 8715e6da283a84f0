"""What the API publishes is what it judges, checked by a client nobody on the project wrote:
schemathesis generates requests from GET /v1/openapi.json, valid and invalid ones, for every
operation of a real serve, and checks each answer.

* not_a_server_error: no request gets a 5xx.
* positive_data_acceptance: a request the schema allows is never refused as malformed (400);
  it may be refused for what the node holds (404 no such agent, 409 the name is taken, 403 the
  key may not, 422 the node refuses it: a ticket whose signature does not verify, a repair
  while serve runs, an embedder whose model is not installed).
* negative_data_rejection: a request the schema forbids gets 400 invalid_params, nothing else.
* status_code_conformance: every status answered is one the operation documents.
* response_schema_conformance: every answer fits the schema published for its status (a
  command's ``data`` its answer model's).

The operations are split between concurrent schemathesis processes against the one serve: the
time is the client's own per-operation work (schema canonicalisation, satisfiability checks,
validator builds), not the serve's, so the processes overlap on cores the machine has free. Each
process writes a JUnit report naming the operations it ran; their union must be exactly what
the API publishes, each operation once, so a partition mistake fails the test.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

import pytest

from memmesh.node import Node
from memmesh.node.api_token import read_token
from tests.procs import Serve

pytestmark = pytest.mark.slow

CHECKS = ("not_a_server_error,positive_data_acceptance,negative_data_rejection,status_code_conformance,"
          "response_schema_conformance")

# docs/api.md's rule: 400 invalid_params is "does not fit the schema", and only that; a request
# that fits may still be refused for the node's state (403, 404, 409, 422).
CONFIG = """
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "403", "404", "409", "422"]

[checks.negative_data_rejection]
expected-statuses = ["400"]

# The agent routes act for the agent the path names: alpha exists, so generated tool calls,
# auto-recalls and chat lines reach the handlers (a random name is a 404 and tests nothing).
[[operations]]
include-path-regex = "^/v1/agents/"
parameters = { "path.agent" = "alpha" }

# A chat line is a small language of its own (/memory SUBCOMMAND ARGS): a string in the schema,
# whose words the grammar then checks as the subcommand's parameters (400 when they do not fit).
[[operations]]
include-path = "/v1/agents/{agent}/command"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "403", "404", "409", "422"]
"""

# Left out: backup writes a copy of the home wherever a request says, and the event stream
# answers for as long as the client listens.
EXCLUDED = ("/v1/backup", "/v1/events")

# The partition, balanced by measured client time (one process, 10 examples per operation and
# phase, about 73 s in all): three operations dominate, tools/remember ~20 s, history/summary
# ~18 s, history/add ~9 s; everything else is 0.03-2 s. Process 0 takes the agent routes
# (remember, recall 2 s, autorecall 1 s, the other tools: ~25 s) with history/add and the
# episode routes (~3 s): ~37 s. Process 1 takes the rest, history/summary and 50-odd cheap
# operations: ~36 s. Run together, the two finished within 1-8 s of each other. Each path
# regex here is one process; the last process takes what none of them matches. Two, not
# three: the client is CPU-bound, the machine has 2 cores, and a third process measured no
# faster while costing more CPU.
# Schemathesis leaves out the endpoint it loads the schema from unless a filter names it, so
# process 0 names GET /v1/openapi.json (one cheap operation) and every published one is run.
PARTS = (r"^/v1/(agents/|history/add$|episode/|openapi\.json$)",)

HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


def _published_operations(api: str, token: str) -> set[str]:
    """Every operation the serve publishes, as schemathesis labels them ("POST /v1/x")."""
    request = urllib.request.Request(f"http://{api}/v1/openapi.json", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        schema = json.load(answer)
    return {f"{method.upper()} {path}" for path, item in schema["paths"].items()
            for method in item if method in HTTP_METHODS and path not in EXCLUDED}


def _filters(index: int) -> list[str]:
    if index < len(PARTS):
        return ["--include-path-regex", PARTS[index]]
    return ["--exclude-path-regex", "|".join(f"(?:{part})" for part in PARTS)]


def _report(path: Path) -> tuple[list[str], list[str]]:
    """(operations run, operations with a failure or error) from one process's JUnit report."""
    if not path.exists():
        return [], []
    cases = ElementTree.parse(path).getroot().iter("testcase")
    ran, failed = [], []
    for case in cases:
        ran.append(case.get("name", ""))
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(case.get("name", ""))
    return ran, failed


def test_every_operation_of_a_real_serve_judges_requests_by_the_schema_it_publishes(tmp_path):
    pytest.importorskip("schemathesis")
    home = tmp_path / "node"
    with Node.open(home) as node:
        node.run("embedder.set", {"provider": "none"})
        node.run("agent.new", {"name": "alpha"})
        node.run("memory.new", {"name": "notes"})
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    serve = Serve(home).start()
    procs: list[subprocess.Popen] = []
    try:
        serve.wait_ready()
        token = read_token(home)
        published = _published_operations(serve.info["api"], token)
        # Bounded (one to two minutes on 2 cores): 10 cases per operation and phase, deterministic.
        # One worker per process: with two threads, Python 3.11's compile() (hypothesis
        # describes its filters with it) raced ("AST constructor recursion depth mismatch").
        # Output goes to files: a full pipe would stall a process nobody is reading yet.
        for index in range(len(PARTS) + 1):
            run = tmp_path / f"st{index}"
            run.mkdir()
            with open(run / "stdout", "w") as out, open(run / "stderr", "w") as err:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
                     f"http://{serve.info['api']}/v1/openapi.json", "-H", f"Authorization: Bearer {token}",
                     "--checks", CHECKS, "--max-examples", "10", "--generation-deterministic", "--workers", "1",
                     *(arg for path in EXCLUDED for arg in ("--exclude-path", path)), *_filters(index),
                     "--report", "junit", "--report-junit-path", str(run / "junit.xml"), "--no-color"],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=run))
        deadline = time.monotonic() + 600
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))

        problems, ran = [], Counter[str]()
        for index, proc in enumerate(procs):
            run = tmp_path / f"st{index}"
            stdout, stderr = (run / "stdout").read_text(), (run / "stderr").read_text()
            operations, failed = _report(run / "junit.xml")
            ran.update(operations)
            if proc.returncode == 0 and ("No issues found" in stdout or " passed" in stdout):
                continue
            # The failures (each with its request and answer) come before the warnings and summary.
            failures = stdout.partition("= FAILURES =")[2].partition("= WARNINGS =")[0]
            summary = (failures[:8000] or stdout[-4000:] or stderr[-4000:]) + stdout[-600:]
            problems.append(f"schemathesis process {index} ({' '.join(_filters(index))}) exited {proc.returncode}; "
                            f"failing operations: {', '.join(failed) or 'none reported'}\n{summary}")
        assert not problems, "\n\n".join(problems)
        assert set(ran) == published and all(count == 1 for count in ran.values()), (
            f"the processes must run every published operation exactly once; "
            f"not run: {sorted(published - set(ran))}, not published: {sorted(set(ran) - published)}, "
            f"run twice: {sorted(label for label, count in ran.items() if count > 1)}")
        assert "Traceback" not in serve.log(), serve.log()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        serve.stop()
