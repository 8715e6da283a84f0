"""`memmesh explain`: why an entry was accepted or refused, through the command line (its
main() in this process, ``mm_here``; as separate `memmesh` processes where that is the point:
an unknown id's exit code and line, a refusal explained by a later process)."""
from __future__ import annotations

import json

import pytest

from memmesh.node import Node
from tests.homes import agent_with_bank
from tests.test_cli import mm, mm_here


@pytest.fixture
def home(home):
    """conftest's home (no embedder) with agent alpha writing bank notes, set up through the
    library (faster than the CLI)."""
    with Node.open(home) as node:
        agent_with_bank(node.run)
    return home


def test_explain_an_accepted_entry_asks_every_database(home):
    entry = json.loads(mm_here("remember", "alpha", "deploy", "nix build", "--bank", "notes", "--json",
                          home=home).stdout)["entry"]
    out = mm_here("explain", entry, home=home).stdout
    assert "Accepted" in out and entry in out and "notes" in out
    data = json.loads(mm_here("explain", entry, "--json", home=home).stdout)
    assert data["entry"] == entry and data["name"] == "notes"
    assert data["explanation"].splitlines()[1].startswith("Accepted")


def test_explain_with_bank_asks_only_that_bank(home):
    entry = json.loads(mm_here("remember", "alpha", "k", "in alpha's own database", "--json",
                               home=home).stdout)["entry"]
    by_agent = json.loads(mm_here("explain", entry, "--bank", "alpha", "--json", home=home).stdout)
    assert by_agent["name"] == "alpha" and "Accepted" in by_agent["explanation"]
    elsewhere = mm_here("explain", entry, "--bank", "notes", home=home, check=False)
    assert elsewhere.returncode == 1 and elsewhere.stdout == ""
    [line] = elsewhere.stderr.strip().splitlines()
    assert "not known to notes" in line
    missing_bank = mm_here("explain", entry, "--bank", "no-such-bank", home=home, check=False)
    assert missing_bank.returncode == 1 and "no bank 'no-such-bank'" in missing_bank.stderr


def test_explain_an_unknown_id_is_one_line_and_exit_1(home):
    unknown = "sha256:" + "0" * 64
    proc = mm("explain", unknown, home=home, check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    [line] = proc.stderr.strip().splitlines()
    assert line == f"memmesh: error: {unknown} is not known to any database of this node"


def test_explain_an_entry_refused_before_storage_in_a_later_process(home):
    """The refusal record is persistent: a new CLI process explains a refused entry by the
    digest of its bytes."""
    from memmesh.crdt.entry import id_of

    with Node.open(home) as node:
        bank = node.agents.resolve("notes").db
        stored = list(bank.storage.entries(bank.id))[-1]  # not the root: its id is the database id
        forged = bytearray(stored.header)
        forged[-1] ^= 1  # the signature no longer verifies
        bank.ingest([(bytes(forged), dict(stored.payloads))], source="peer:test")
    digest = id_of(bytes(forged))
    out = mm("explain", digest, home=home).stdout
    assert "refused (entry.signature) from peer:test" in out and "notes" in out
