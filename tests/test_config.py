"""config.yaml in process: load errors name the file and the line; the template and an empty file
are the defaults; applying is idempotent (entry counts over three open + reload cycles); a reload
adds an agent; a malformed file keeps the last good config; conflicts change nothing;
allowed_tools holds through the CLI; `config check` validates without applying; auto_recall
defaults sit below an agent's own config, and its memory-config keys follow parse_config_value's
rule; serve's flags > config.yaml > defaults."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from memmesh.node import Node
from memmesh.node.cli import main
from memmesh.node.config_apply import apply_config, reload_config
from memmesh.node.listen import DEFAULT_HOST, DEFAULT_PORT
from memmesh.node.memory.agents import CONFIG_DEFAULTS, ConfigError, agent_state, parse_config_value
from memmesh.node.registry import EMBEDDER_SECRET
from memmesh.node.serve_config import LiveConfig, StartConfig, SyncFlags
from memmesh.node.settings import (
    APPLIED,
    AUTO_RECALL_KEYS,
    CONFIG_FILE,
    TEMPLATE,
    ConfigFileError,
    NodeConfig,
    SyncSpec,
    ToolNotAllowed,
    applied,
    load_config,
    memory_defaults,
    parse_config,
)
from memmesh.node.sync.service import SyncService
from memmesh.node.worker import Network

CONFIG = """\
agents:
  - name: alpha
    system_prompt: "You are alpha."
    allowed_tools: [recall, list_memory_banks]
    default_memory_banks: [notes, ops]
sync:
  interval_s: 2
"""


def _write(home: Path, text: str) -> Path:
    path = home / CONFIG_FILE
    path.write_text(text)
    return path


def _entries(node: Node) -> dict[str, int]:
    """Every database's entry count: what "writes no new entry anywhere" is checked against."""
    return {db_id: len(node.database(db_id)) for db_id in node.database_ids()}


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------- loading
MALFORMED = [
    ("bad YAML", "agents:\n  - name: alpha\n    allowed_tools: [recall\nsync: {}\n", 4, "not valid YAML"),
    ("tab indent", "sync:\n\tfanout: 3\n", 2, "not valid YAML"),
    ("duplicate key", "sync:\n  fanout: 2\n  interval_s: 3\n  fanout: 4\n", 4,
     "sync: key 'fanout' appears twice (first at line 2)"),
    ("duplicate section", "sync: {}\napi: {}\nsync: {}\n", 3, "key 'sync' appears twice (first at line 1)"),
    ("wrong type", "sync:\n  fanout: 3\n  interval_s: soon\n", 3,
     "sync.interval_s: should be a valid number (got 'soon')"),
    ("quoted number", "auto_recall:\n  max_entries: '5'\n", 2, "auto_recall.max_entries: should be a valid integer"),
    ("out of range", "auto_recall:\n  max_entries: 50\n", 2,
     "max_entries: should be less than or equal to 20 (got 50)"),
    ("unknown key", "sync:\n  interval_s: 3\n  fan_out: 2\n", 3,
     "sync.fan_out: unknown key; sync takes listen, advertise, peers, interval_s, fanout, discovery"),
    ("unknown section", "agents: []\nembeding:\n  backend: hashed\n", 2,
     "embeding: unknown key; the file takes agents"),
    ("tool not known", "agents:\n  - name: alpha\n    allowed_tools:\n      - recall\n      - obliterate\n", 5,
     "agents[0].allowed_tools[1]: should be 'remember', 'recall', 'list_memory_banks', 'neighbors' or 'forget' "
     "(got 'obliterate')"),
    ("missing name", "agents:\n  - name: alpha\n  - system_prompt: hi\n", 3, "agents[1]: needs name"),
    ("bad name", "agents:\n  - name: 'has space'\n", 2,
     "agents[0].name: should be 1-64 ASCII letters, digits, '.', '_' or '-', starting with a letter or digit "
     "(got 'has space')"),
    ("agent twice", "agents:\n  - name: a\n  - name: a\n", 3, "agent 'a' is listed twice"),
    ("bank is an agent", "agents:\n  - name: a\n  - name: b\n    default_memory_banks: [x, a]\n", 4,
     "agents[1].default_memory_banks[1]: 'a' is an agent's name, not a bank"),
    ("listen", "sync:\n  listen: localhost\n", 2, "sync.listen: should be HOST:PORT"),
    ("peer address", "sync:\n  peers:\n    - http:127.0.0.1:7411\n    - 127.0.0.1:7412\n", 4,
     "sync.peers[1]: should be an address http:HOST:PORT"),
    ("remote without provider", "embedding:\n  backend: remote\n  model: m\n", 2, "backend remote needs provider"),
    ("key variable for hashed", "embedding:\n  backend: hashed\n  api_key_env: KEY\n", 3,
     "embedding.api_key_env: api_key_env is for backend remote"),
    ("the key itself", "embedding:\n  backend: remote\n  provider: openai\n  api_key_env: sk-abc123\n", 4,
     "embedding.api_key_env: should be the name of an environment variable (ASCII letters, digits and '_'), not its value"),
    ("python tag", "sync:\n  listen: !!python/object/apply:os.system ['true']\n", 2,
     "sync.listen: the tag !!python/object/apply:os.system is not allowed "
     "(config.yaml is read with safe loading only)"),
    ("python scalar tag", "sync:\n  fanout: 3\n  listen: !!python/name:os.system\n", 3,
     "sync.listen: the tag !!python/name:os.system is not allowed"),
    ("merge key", "base: &b {fanout: 2}\nsync:\n  <<: *b\n", 3, "merge keys (<<) are not supported"),
    ("two documents", "sync: {}\n---\napi: {}\n", 2, "expected a single document"),
    ("not a mapping", "- agents\n", 1, "should be a mapping (key: value lines) of the sections"),
    ("section not a mapping", "sync: fast\n", 1, "sync: should be a mapping (key: value lines) (got 'fast')"),
    # the memory-config keys: parse_config_value's words, the line of the entry at fault
    ("half-life", "auto_recall:\n  half_lives:\n    fact: 30\n    decision: -1\n", 4,
     "auto_recall.half_lives: the half-life of 'decision' is a number of days above 0 and at most 36500, got -1"),
    ("category", "auto_recall:\n  half_lives: {'Not A Slug': 3}\n", 2, "'Not A Slug' is not a category name"),
    ("quarantined weight", "auto_recall:\n  trust_weights:\n    ingested: 0.5\n    quarantined: 0\n", 4,
     "auto_recall.trust_weights: trust_weights maps trust tiers (owner, derived, peer, ingested, flagged) to weights from "
     "0 to 1, as JSON '{\"ingested\": 0.5}' or ingested=0.5,flagged=0; 'quarantined' is not a weighted tier"),
    ("weight", "auto_recall:\n  trust_weights: {flagged: 1.5}\n", 2,
     "auto_recall.trust_weights: the weight of 'flagged' is a number from 0 to 1, got 1.5"),
    ("include_secrets", "auto_recall:\n  enabled: true\n  include_secrets: maybe\n", 3,
     "auto_recall.include_secrets: include_secrets is true or false, got 'maybe'"),
    ("deadline", "auto_recall:\n  deadline_ms: 20000\n", 2,
     "auto_recall.deadline_ms: auto_recall_deadline_ms is a whole number of milliseconds from 0 (auto-recall off) "
     "to 10000, got 20000"),
]


@pytest.mark.parametrize("text,line,fragment", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_a_malformed_file_names_its_line_and_what_is_wrong(tmp_path, text, line, fragment):
    path = tmp_path / CONFIG_FILE
    path.write_text(text)
    with pytest.raises(ConfigFileError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}:{line}: "), str(err.value)
    assert fragment in str(err.value)
    assert (err.value.file, err.value.line) == (str(path), line)
    assert "\n" not in str(err.value) and "sk-abc123" not in str(err.value)  # a pasted key is never echoed


def test_several_problems_report_the_first_and_count_the_rest(tmp_path):
    with pytest.raises(ConfigFileError) as err:
        parse_config("sync:\n  fanout: 0\n  interval_s: -1\napi:\n  allow_remote: 1\n", "c.yaml")
    assert str(err.value) == "c.yaml:2: sync.fanout: should be greater than or equal to 1 (got 0) (and 2 more problems)"


def test_bytes_that_are_not_utf8_name_their_line(tmp_path):
    path = tmp_path / CONFIG_FILE
    path.write_bytes(b"sync:\n  fanout: 3\n  listen: \xff\n")
    with pytest.raises(ConfigFileError, match=r":3: is not UTF-8 text"):
        load_config(path)


def test_empty_files_the_template_and_empty_sections_are_the_defaults(tmp_path):
    for text in ("", "# only a comment\n\n", TEMPLATE, "sync:\nagents:\nauto_recall:\n  max_entries:\n"):
        assert parse_config(text, "c.yaml").same_as(NodeConfig())


def test_init_writes_the_commented_template_once(tmp_path, capsys):
    home = tmp_path / "fresh"
    code, out, _ = _cli(capsys, "--home", str(home), "init")
    assert code == 0 and f"wrote {home / CONFIG_FILE}" in out
    assert (home / CONFIG_FILE).read_text() == TEMPLATE
    assert all(not line.strip() or line.startswith("#") for line in TEMPLATE.splitlines())
    assert load_config(home / CONFIG_FILE).same_as(NodeConfig())
    (home / CONFIG_FILE).write_text("sync:\n  fanout: 2\n")  # the operator's own file is never replaced
    code, out, _ = _cli(capsys, "--home", str(home), "init")
    assert code == 0 and "nothing changed" in out and "wrote" not in out
    assert (home / CONFIG_FILE).read_text() == "sync:\n  fanout: 2\n"


def test_the_template_documents_every_key():
    """Each key of the schema appears (commented) in the template a user starts from."""
    def keys(model, prefix=""):
        for name, info in model.model_fields.items():
            yield name
            inner = info.annotation
            for arg in getattr(inner, "__args__", ()) + (inner,):
                if isinstance(arg, type) and hasattr(arg, "model_fields"):
                    yield from keys(arg)
    for key in set(keys(NodeConfig)):
        assert f"{key}:" in TEMPLATE, key


# ---------------------------------------------------------------------- applying
def test_default_banks_are_idempotent_over_three_open_and_reload_cycles(home):
    _write(home, CONFIG)
    counts = []
    for cycle in range(3):
        with Node.open(home) as node:
            before = _entries(node)
            done = reload_config(node)
            after = _entries(node)
            if cycle == 0:
                assert "agent alpha created" in done.changes
                assert "bank notes created" in done.changes and "alpha granted write on bank ops" in done.changes
                assert after != before
            else:
                assert done.changes == [] and after == before, (cycle, done.changes)
            alpha = node.agents.agent("alpha")
            refs = agent_state(alpha.db).refs
            for bank in ("notes", "ops"):
                ref = node.agents.resolve(bank)
                assert ref.db.permission(str(alpha.key.public)).level == "write"
                assert refs[ref.db.id]["name"] == bank
            counts.append(after)
    assert counts[0] == counts[1] == counts[2]
    assert len(counts[0]) == 3  # alpha's own database and the two banks, nothing more


def test_a_bank_granted_and_referenced_already_is_left_alone_and_a_missing_ref_is_added(home):
    with Node.open(home) as node:
        node.run("agent.new", {"name": "alpha"})
        node.run("memory.new", {"name": "notes"})
        node.run("memory.grant", {"bank": "notes", "agent": "alpha", "perm": "write"})
        node.run("memory.new", {"name": "ops"})
        alpha = node.agents.agent("alpha")
        ops = node.agents.resolve("ops")
        node.agents.grant("ops", "alpha", "write")
        node.agents.write_ref(alpha, {"op": "remove", "bank": ops.db.id})  # granted, not referenced
        before = _entries(node)
        changes = apply_config(node, parse_config(CONFIG, "c.yaml"))
        # Granted and referenced already: nothing is granted again; its default banks are attached.
        assert [c for c in changes if "notes" in c and "attached" not in c] == []
        assert "bank ops referenced from alpha's database" in changes
        after = _entries(node)
        # alpha's database: the reference to ops, then one entry attaching both default banks.
        assert {k: after[k] - before[k] for k in after} == {alpha.db.id: 2, ops.db.id: 0,
                                                             node.agents.resolve("notes").db.id: 0}
        again = _entries(node)
        apply_config(node, parse_config(CONFIG, "c.yaml"))
        assert _entries(node) == again  # idempotent: the second application writes nothing


def test_a_reload_adds_an_agent_and_leaves_the_others_as_they_are(home):
    _write(home, CONFIG)
    with Node.open(home) as node:
        reload_config(node)
        alpha_entries = len(node.agents.agent("alpha").db)
        _write(home, CONFIG.replace("sync:", "  - name: beta\n    default_memory_banks: [notes]\nsync:"))
        changes = node.run("reload", {}).data["changes"]
        assert "agent beta created" in changes and "beta granted write on bank notes" in changes
        assert "bank notes created" not in changes
        assert len(node.agents.agent("alpha").db) == alpha_entries
        assert applied(node).agent("beta") is not None
        assert [a.name for a in node.agents.agents()] == ["alpha", "beta"]


def test_a_malformed_file_keeps_the_last_good_config_and_writes_nothing(home):
    _write(home, CONFIG)
    with Node.open(home) as node:
        reload_config(node)
        good = node.registry.config(APPLIED)
        before = _entries(node)
        _write(home, CONFIG.replace("  interval_s: 2", "  interval_s: 2\n  fanout: many")
               .replace("name: alpha", "name: alpha\n  - name: beta"))
        with pytest.raises(ConfigFileError) as err:
            node.run("reload", {})
        assert f"{CONFIG_FILE}:9: sync.fanout: should be a valid integer (got 'many')" in str(err.value)
        assert node.registry.config(APPLIED) == good
        assert _entries(node) == before and node.registry.agent("beta") is None
        with pytest.raises(ToolNotAllowed):  # the last good config still holds
            node.call_tool("alpha", "remember", {"key": "k", "value": "v"})


def test_a_missing_file_means_the_defaults(home):
    _write(home, CONFIG)
    with Node.open(home) as node:
        reload_config(node)
        (home / CONFIG_FILE).unlink()
        done = reload_config(node)
        assert applied(node).same_as(NodeConfig())
        assert any("alpha: no longer in config.yaml" in c for c in done.changes)
        assert node.registry.agent("alpha") is not None  # nothing is deleted
        node.call_tool("alpha", "remember", {"key": "k", "value": "v"})  # no profile: every tool


@pytest.mark.parametrize("setup,text,line,fragment", [
    ("agent.new", "agents:\n  - name: alpha\n  - name: beta\n    default_memory_banks: [x]\n"
     "  - name: gamma\n    default_memory_banks: [taken]\n", 6, "'taken' is an agent on this node, not a bank"),
    ("memory.new", "agents:\n  - name: alpha\n  - name: taken\n", 3,
     "'taken' is a bank on this node; an agent needs a name of its own"),
])
def test_a_name_clash_with_the_node_changes_nothing(home, setup, text, line, fragment):
    with Node.open(home) as node:
        node.run(setup, {"name": "taken"})
        before, agents = _entries(node), node.registry.agents()
        path = _write(home, text)
        with pytest.raises(ConfigFileError) as err:
            reload_config(node)
        assert str(err.value).startswith(f"{path}:{line}: ") and fragment in str(err.value)
        assert _entries(node) == before and node.registry.agents() == agents
        assert node.registry.config(APPLIED) is None


def test_an_unset_key_variable_names_its_line_and_a_set_one_is_stored_as_a_secret(home, monkeypatch):
    text = ("embedding:\n  backend: remote\n  provider: openai\n  model: text-embedding-3-small\n"
            "  api_base: http://127.0.0.1:9\n  api_key_env: MEMMESH_TEST_EMBED_KEY\n")
    path = _write(home, text)
    monkeypatch.delenv("MEMMESH_TEST_EMBED_KEY", raising=False)
    with Node.open(home) as node:
        before = node.embedder_config()
        with pytest.raises(ConfigFileError) as err:
            reload_config(node)
        assert str(err.value).startswith(f"{path}:6: embedding.api_key_env: environment variable "
                                         "MEMMESH_TEST_EMBED_KEY is not set")
        assert node.embedder_config() == before and node.registry.secret(EMBEDDER_SECRET) is None
        monkeypatch.setenv("MEMMESH_TEST_EMBED_KEY", "sk-test-secret")
        done = reload_config(node)
        assert "embedder set to openai/text-embedding-3-small" in done.changes
        assert node.registry.secret(EMBEDDER_SECRET) == "sk-test-secret"
        assert "sk-test-secret" not in json.dumps(node.registry.config(APPLIED))
        assert reload_config(node).changes == []  # same file, same key: nothing to set


def test_the_embedder_is_set_only_when_it_differs(home):
    _write(home, "embedding:\n  backend: hashed\n")
    with Node.open(home) as node:
        assert reload_config(node).changes == ["embedder set to hashed"]
        assert node.embedder_config().provider == "hashed"
        assert reload_config(node).changes == []
        node.run("embedder.set", {"provider": "none"})  # changed by hand: the file puts it back
        assert reload_config(node).changes == ["embedder set to hashed"]


# ---------------------------------------------------------------------- allowed_tools
def test_allowed_tools_hold_through_the_cli(home, capsys):
    _write(home, CONFIG + "  fanout: 2\n")
    h = str(home)
    assert _cli(capsys, "--home", h, "reload")[0] == 0
    assert _cli(capsys, "--home", h, "agent", "new", "free")[0] == 0  # not in config.yaml
    with Node.open(home) as node:
        before = _entries(node)
    for argv in (["tool", "alpha", "remember", '{"key": "k", "value": "v"}'], ["remember", "alpha", "k", "v"],
                 ["remember", "alpha", "k", "v", "--bank", "notes"]):
        code, out, err = _cli(capsys, "--home", h, *argv)
        assert code == 1 and out == ""
        assert err == ("memmesh: error: agent alpha may not use remember: its allowed_tools in config.yaml are "
                       "recall, list_memory_banks\n")
    with Node.open(home) as node:
        assert _entries(node) == before  # nothing was written
    assert _cli(capsys, "--home", h, "recall", "alpha", "k")[0] == 0
    assert _cli(capsys, "--home", h, "tool", "alpha", "list_memory_banks")[0] == 0
    assert _cli(capsys, "--home", h, "tool", "free", "remember", '{"key": "k", "value": "v"}')[0] == 0

    _write(home, CONFIG.replace("allowed_tools: [recall, list_memory_banks]", "allowed_tools: []"))
    assert _cli(capsys, "--home", h, "reload")[0] == 0
    for argv in (["tool", "alpha", "list_memory_banks"], ["recall", "alpha", "k"]):
        code, _out, err = _cli(capsys, "--home", h, *argv)
        assert code == 1 and "its allowed_tools in config.yaml are empty" in err


# ---------------------------------------------------------------------- commands
def test_config_check_validates_without_applying(home, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("mine.yaml").write_text(CONFIG)
    code, out, _ = _cli(capsys, "--home", str(home), "config", "check", "mine.yaml")
    assert code == 0
    assert out.startswith(f"{tmp_path / 'mine.yaml'}: ok (agents: alpha;")
    Path("broken.yaml").write_text(CONFIG.replace("recall, list", "recal, list"))
    code, out, err = _cli(capsys, "--home", str(home), "config", "check", "broken.yaml")
    assert code == 1 and err.startswith(f"memmesh: error: {tmp_path / 'broken.yaml'}:4: agents[0].allowed_tools[0]: ")
    code, _out, err = _cli(capsys, "--home", str(home), "config", "check", "absent.yaml")
    assert code == 1 and "absent.yaml" in err
    _write(home, "sync:\n  fanout: 1\n")
    code, out, _ = _cli(capsys, "--home", str(home), "config", "check")
    assert code == 0 and out.startswith(f"{home / CONFIG_FILE}: ok")
    with Node.open(home) as node:  # nothing of any of them was applied
        assert node.registry.config(APPLIED) is None and node.registry.agents() == []


def test_config_show_prints_the_config_in_force(home, capsys):
    code, out, _ = _cli(capsys, "--home", str(home), "config", "show")
    assert code == 0 and out.startswith("# no config.yaml applied yet")
    _write(home, CONFIG)
    _cli(capsys, "--home", str(home), "reload")
    code, out, _ = _cli(capsys, "--home", str(home), "--json", "config", "show")
    shown = json.loads(out)
    assert shown["agents"][0]["allowed_tools"] == ["recall", "list_memory_banks"]
    assert shown["sync"]["interval_s"] == 2.0
    code, out, _ = _cli(capsys, "--home", str(home), "config", "show")
    assert parse_config(out, "shown").same_as(load_config(home / CONFIG_FILE))  # the YAML loads back


def test_auto_recall_defaults_sit_below_the_agents_own_config(home, capsys):
    _write(home, "auto_recall:\n  enabled: false\n  max_entries: 7\n")
    with Node.open(home) as node:
        reload_config(node)
        node.run("agent.new", {"name": "alpha"})
        node.call_tool("alpha", "remember", {"key": "deploy", "value": "nix build then scp"})
        shown = node.run("memory.config", {"agent": "alpha", "action": "show"}).data["config"]
        assert (shown["auto_recall_enabled"], shown["max_entries"]) == (False, 7)
        assert node.auto_recall("alpha", ["how do we deploy?"]) == ""  # disabled node-wide
        node.run("memory.config", {"agent": "alpha", "action": "set", "key": "auto_recall_enabled", "value": "true"})
        shown = node.run("memory.config", {"agent": "alpha", "action": "show"}).data["config"]
        assert (shown["auto_recall_enabled"], shown["max_entries"]) == (True, 7)  # its own value wins
        assert "deploy" in node.auto_recall("alpha", ["how do we deploy?"])
        node.run("memory.config", {"agent": "alpha", "action": "reset"})
        shown = node.run("memory.config", {"agent": "alpha", "action": "show"}).data["config"]
        assert (shown["auto_recall_enabled"], shown["max_entries"]) == (False, 7)  # back to the node's


MEMORY_SECTION = """\
auto_recall:
  max_entries: 5
  half_lives:
    fact: 30
    "*": 90
  trust_weights: {ingested: 0.25}
  include_secrets: true
  deadline_ms: 0
"""


def test_the_memory_config_keys_are_node_defaults_that_an_agents_own_config_overrides(home, capsys):
    h = str(home)
    _write(home, MEMORY_SECTION)
    code, out, _ = _cli(capsys, "--home", h, "config", "check")
    assert code == 0 and out.startswith(f"{home / CONFIG_FILE}: ok")
    assert _cli(capsys, "--home", h, "reload")[0] == 0
    assert _cli(capsys, "--home", h, "agent", "new", "alpha")[0] == 0
    node_wide = {"max_entries": 5, "half_lives": {"*": 90.0, "fact": 30.0},
                 "trust_weights": {"owner": 1.0, "derived": 0.8, "peer": 1.0, "ingested": 0.25, "flagged": 0.5},
                 "include_secrets": True, "auto_recall_deadline_ms": 0}
    with Node.open(home) as node:
        assert memory_defaults(node) == {**CONFIG_DEFAULTS, **node_wide}
    code, out, _ = _cli(capsys, "--home", h, "--json", "config", "show")
    assert json.loads(out)["auto_recall"] == {"enabled": True, "max_entries": 5, "half_lives": {"*": 90.0, "fact": 30.0},
                                              "trust_weights": node_wide["trust_weights"], "include_secrets": True,
                                              "deadline_ms": 0, "min_similarity": None}
    assert _cli(capsys, "--home", h, "memory", "config", "alpha", "set", "half_lives", "decision=365")[0] == 0
    assert _cli(capsys, "--home", h, "memory", "config", "alpha", "set", "auto_recall_deadline_ms", "80")[0] == 0
    code, out, _ = _cli(capsys, "--home", h, "--json", "memory", "config", "alpha", "show")
    shown = json.loads(out)["config"]
    assert (shown["half_lives"], shown["auto_recall_deadline_ms"]) == ({"decision": 365.0}, 80)  # its own win
    assert (shown["trust_weights"], shown["include_secrets"]) == (node_wide["trust_weights"], True)  # the node's
    assert _cli(capsys, "--home", h, "memory", "config", "alpha", "reset")[0] == 0
    code, out, _ = _cli(capsys, "--home", h, "--json", "memory", "config", "alpha", "show")
    assert {k: json.loads(out)["config"][k] for k in node_wide} == node_wide


def test_a_refused_memory_config_value_applies_nothing(home, capsys):
    _write(home, MEMORY_SECTION)
    with Node.open(home) as node:
        reload_config(node)
        good, defaults = node.registry.config(APPLIED), memory_defaults(node)
        path = _write(home, MEMORY_SECTION.replace("deadline_ms: 0", "deadline_ms: 0\n  enabled: false")
                      .replace("ingested: 0.25", "ingested: 0.25, flagged: -1"))
        with pytest.raises(ConfigFileError) as err:
            node.run("reload", {})
        assert str(err.value).startswith(f"{path}:6: auto_recall.trust_weights: the weight of 'flagged' ")
        assert node.registry.config(APPLIED) == good and memory_defaults(node) == defaults
    code, _out, err = _cli(capsys, "--home", str(home), "config", "check")
    assert code == 1 and f"{path}:6: auto_recall.trust_weights" in err
    _write(home, MEMORY_SECTION.replace("deadline_ms: 0", "deadline_ms: 40"))
    with Node.open(home) as node:
        assert reload_config(node).changes == ["auto_recall.deadline_ms: 0 -> 40"]
        assert memory_defaults(node)["auto_recall_deadline_ms"] == 40


MEMORY_KEYS = [k for k in AUTO_RECALL_KEYS if k not in ("enabled", "max_entries")]
scalars = st.one_of(st.booleans(), st.integers(-5, 20_000), st.floats(-2, 40_000, allow_nan=False),
                    st.sampled_from(["", "off", "yes", "50", "fact=30", "ingested=0.5", "Bad Cat", "*"]))
values = st.one_of(scalars, st.dictionaries(st.sampled_from(["fact", "*", "owner", "flagged", "quarantined", "Bad"]),
                                            scalars, max_size=3))


@settings(max_examples=150, deadline=None)
@given(key=st.sampled_from(MEMORY_KEYS), value=values)
def test_config_yaml_takes_a_memory_key_exactly_when_parse_config_value_does(key, value):
    text = yaml.safe_dump({"auto_recall": {key: value}}, sort_keys=False)
    name = AUTO_RECALL_KEYS[key]
    try:
        want = parse_config_value(name, value)
    except ConfigError as exc:
        with pytest.raises(ConfigFileError) as err:
            parse_config(text, "c.yaml")
        assert str(err.value).endswith(str(exc).removeprefix(f"{name}: "))
    else:
        got = parse_config(text, "c.yaml").auto_recall.memory_config()[name]
        assert got == want


# ---------------------------------------------------------------------- serve's settings
def test_flags_win_over_the_file_which_wins_over_the_defaults():
    spec = SyncSpec(listen="127.0.0.1:7500", interval_s=2.0, fanout=5, discovery=False, peers=["http:127.0.0.1:7600"])
    assert SyncFlags().resolve(SyncSpec()).listen == f"{DEFAULT_HOST}:{DEFAULT_PORT}"
    got = SyncFlags().resolve(spec)
    assert (got.listen, got.interval_s, got.fanout, got.discovery, got.peers) == \
        ("127.0.0.1:7500", 2.0, 5, False, ("http:127.0.0.1:7600",))
    got = SyncFlags(listen="127.0.0.1:0", interval_s=9.0, fanout=1, discovery=False).resolve(
        SyncSpec(discovery=True))
    assert (got.listen, got.interval_s, got.fanout, got.discovery) == ("127.0.0.1:0", 9.0, 1, False)


def test_a_reload_reaches_the_daemon_and_says_what_needs_a_restart(home):
    with Node.open(home) as node:
        flags = SyncFlags(listen="127.0.0.1:0", fanout=4)
        start = StartConfig.load(node, flags)
        sync = SyncService(node, address="http:127.0.0.1:1", discovery=False, interval_s=start.running.interval_s,
                           fanout=start.running.fanout, peers=start.running.peers)
        with node.serving(Network(config=LiveConfig(start, sync))):
            _write(home, "sync:\n  listen: 127.0.0.1:7999\n  interval_s: 0.5\n  fanout: 9\n  discovery: false\n"
                         "  peers: [http:127.0.0.1:7998]\napi:\n  listen: 127.0.0.1:7997\n")
            done = reload_config(node)
            assert (sync.interval_s, sync.fanout, sync.peers) == (0.5, 4, ("http:127.0.0.1:7998",))  # --fanout pinned
            assert len(done.warnings) == 2
            assert done.warnings[0].startswith('sync.discovery is now false in config.yaml, but serve keeps true')
            assert "api section changed" in done.warnings[1]  # listen is pinned by its flag: no warning
            assert reload_config(node).warnings == done.warnings  # true until serve restarts
