"""memmesh.integrations.langgraph.MemmeshStore with real LangGraph: a compiled graph whose node
reads and writes the store across threads, round trips, search, delete, async, and a second
serve process that imported the bank and sees what the first one's store wrote."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("langgraph")

from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.store.base import BaseStore, GetOp, InvalidNamespaceError, PutOp, SearchOp  # noqa: E402

from memmesh.integrations.langgraph import MemmeshStore, memory_key, parse_memory_key  # noqa: E402
from memmesh.node import Node  # noqa: E402
from tests.procs import processes, until  # noqa: E402


def _init(home: Path, *agents: str, bank: str | None = None) -> Path:
    node, _ = Node.init(home)
    with node:
        node.run("embedder.set", {"provider": "hashed"})
        for name in agents:
            node.run("agent.new", {"name": name})
        if bank is not None:
            node.run("memory.new", {"name": bank})
            for name in agents:
                node.run("memory.grant", {"bank": bank, "agent": name, "perm": "write"})
    return home


@pytest.fixture(params=["here", "serve"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MemmeshStore]:
    """A store for alpha: the home opened in this process, or reached through a running serve."""
    home = _init(tmp_path / "home", "alpha")
    with processes() as procs:
        if request.param == "serve":
            procs.serve(home).start().wait_ready()
        with MemmeshStore(home, agent="alpha") as s:
            assert s.client.through_serve == (request.param == "serve")
            yield s


# ---------------------------------------------------------------------- a real graph
class State(TypedDict, total=False):
    user: str
    text: str
    answer: list[str]


def _chat(state: State, *, store: BaseStore) -> State:
    """Remembers what a user says after "remember", answers with what it recalls."""
    namespace = ("users", state["user"], "memories")
    text = state["text"]
    if text.startswith("remember "):
        fact = text.removeprefix("remember ")
        store.put(namespace, f"fact-{len(store.search(namespace, limit=100))}", {"text": fact})
        return {"answer": [f"noted: {fact}"]}
    return {"answer": [item.value["text"] for item in store.search(namespace, query=text, limit=5)]}


def _graph(store: BaseStore) -> Any:
    builder = StateGraph(State)
    builder.add_node("chat", _chat)
    builder.add_edge(START, "chat")
    builder.add_edge("chat", END)
    return builder.compile(checkpointer=InMemorySaver(), store=store)


def test_a_graph_remembers_across_threads_of_one_user(store: MemmeshStore):
    graph = _graph(store)
    first = {"configurable": {"thread_id": "thread-1"}}
    second = {"configurable": {"thread_id": "thread-2"}}
    assert graph.invoke({"user": "u1", "text": "remember my editor is vim"}, first)["answer"] == [
        "noted: my editor is vim"]
    graph.invoke({"user": "u1", "text": "remember deploys happen on fridays"}, first)
    # Another thread of the same user: what the first stored is there.
    assert graph.invoke({"user": "u1", "text": "which editor do I use"}, second)["answer"] == ["my editor is vim"]
    assert graph.invoke({"user": "u1", "text": "when do deploys happen"}, second)["answer"] == [
        "deploys happen on fridays"]
    # Another user's namespace holds nothing of u1's.
    assert graph.invoke({"user": "u2", "text": "which editor do I use"}, {"configurable": {"thread_id": "t3"}}
                        )["answer"] == []
    assert store.list_namespaces() == [("users", "u1", "memories")]


# ---------------------------------------------------------------------- round trips
_TEXT = st.one_of(st.sampled_from("/%2F5 éü😀\t"), st.characters(blacklist_categories=("Cs",)))
_LABEL = st.text(_TEXT.filter(lambda c: c not in ".\x00"), min_size=1, max_size=8).filter(lambda s: s != "langgraph")
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(_TEXT, max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(_TEXT, max_size=6), inner, max_size=3),
    max_leaves=8)


@given(namespace=st.lists(_LABEL, min_size=1, max_size=3).map(tuple), key=st.text(_TEXT, max_size=16),
       value=st.dictionaries(st.text(_TEXT, max_size=6), _JSON, max_size=4))
def test_memory_keys_parse_back_exactly(namespace: tuple[str, ...], key: str, value: dict[str, Any]):
    assert parse_memory_key(memory_key(namespace, key)) == (namespace, key)


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MemmeshStore]:
    home = _init(tmp_path_factory.mktemp("roundtrip") / "home", "alpha")
    with MemmeshStore(home, agent="alpha") as s:
        yield s


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(namespace=st.lists(_LABEL, min_size=1, max_size=3).map(tuple), key=st.text(_TEXT, max_size=16),
       value=st.dictionaries(st.text(_TEXT, max_size=6), _JSON, max_size=4))
def test_keys_and_values_round_trip_exactly(shared_store: MemmeshStore, namespace: tuple[str, ...], key: str,
                                            value: dict[str, Any]):
    shared_store.put(namespace, key, value)
    item = shared_store.get(namespace, key)
    assert item is not None
    assert (item.namespace, item.key) == (namespace, key)
    assert json.dumps(item.value) == json.dumps(value)  # equal, and in the same key order
    assert item.created_at <= item.updated_at
    assert namespace in shared_store.list_namespaces(prefix=namespace)
    assert any(i.key == key for i in shared_store.search(namespace, limit=100) if i.namespace == namespace)


def test_put_again_keeps_created_at_and_moves_updated_at(store: MemmeshStore):
    store.put(("docs",), "a", {"v": 1})
    first = store.get(("docs",), "a")
    assert first is not None and first.created_at.tzinfo is not None
    until(lambda: dt.datetime.now(dt.UTC) > first.updated_at + dt.timedelta(milliseconds=5), 5, "the clock to move")
    store.put(("docs",), "a", {"v": 2})
    second = store.get(("docs",), "a")
    assert second is not None and second.value == {"v": 2}
    assert second.created_at == first.created_at and second.updated_at > first.updated_at
    assert [i.value for i in store.search(("docs",))] == [{"v": 2}]  # one item, not two versions


# ---------------------------------------------------------------------- search, delete, list
def _fill(store: MemmeshStore) -> None:
    store.put(("team", "recipes"), "pizza", {"title": "Pizza dough", "text": "flour water yeast salt", "stars": 5,
                                             "tags": ["italian"]})
    store.put(("team", "recipes"), "ramen", {"title": "Ramen broth", "text": "pork bones simmered all day",
                                             "stars": 4, "meta": {"origin": "japan"}})
    store.put(("team", "ops"), "deploy", {"title": "Deploys", "text": "nix build then scp to prod", "stars": 3})
    store.put(("home",), "note", {"text": "water the plants", "stars": 1})


def test_search_uses_recall_and_filters_on_value_fields(store: MemmeshStore):
    _fill(store)
    hits = store.search(("team",), query="yeast dough")
    assert [h.key for h in hits] == ["pizza"] and hits[0].namespace == ("team", "recipes")
    assert store.search(("team",), query="quantum chromodynamics") == []  # nothing relevant: nothing
    # No query: newest first, under the prefix only.
    assert [h.key for h in store.search(("team",))] == ["deploy", "ramen", "pizza"]
    assert [h.key for h in store.search(())] == ["note", "deploy", "ramen", "pizza"]
    assert [h.key for h in store.search(("team",), limit=1, offset=1)] == ["ramen"]
    # Filters: equality, nested objects, lists, and the operators.
    assert [h.key for h in store.search(("team",), filter={"stars": 5})] == ["pizza"]
    assert [h.key for h in store.search(("team",), filter={"meta": {"origin": "japan"}})] == ["ramen"]
    assert [h.key for h in store.search(("team",), filter={"tags": ["italian"]})] == ["pizza"]
    assert [h.key for h in store.search(("team",), filter={"stars": {"$gte": 4}})] == ["ramen", "pizza"]
    assert [h.key for h in store.search(("team",), filter={"stars": {"$gt": 3, "$lt": 5}})] == ["ramen"]
    assert [h.key for h in store.search(("team",), filter={"stars": {"$ne": 4}, "title": {"$eq": "Deploys"}})] == [
        "deploy"]
    assert [h.key for h in store.search((), query="water", filter={"stars": {"$lte": 1}})] == ["note"]
    with pytest.raises(ValueError, match="unknown operator '\\$regex'"):
        store.search(("team",), filter={"title": {"$regex": "P.*"}})


def test_list_namespaces(store: MemmeshStore):
    _fill(store)
    store.put(("team", "recipes", "old"), "x", {"text": "kept"})
    assert store.list_namespaces() == [("home",), ("team", "ops"), ("team", "recipes"), ("team", "recipes", "old")]
    assert store.list_namespaces(prefix=("team",)) == [("team", "ops"), ("team", "recipes"),
                                                       ("team", "recipes", "old")]
    assert store.list_namespaces(suffix=("recipes",)) == [("team", "recipes")]
    assert store.list_namespaces(prefix=("*", "recipes")) == [("team", "recipes"), ("team", "recipes", "old")]
    assert store.list_namespaces(max_depth=1) == [("home",), ("team",)]
    assert store.list_namespaces(limit=2, offset=1) == [("team", "ops"), ("team", "recipes")]


def test_delete_forgets_the_item(store: MemmeshStore):
    _fill(store)
    store.delete(("team", "recipes"), "pizza")
    assert store.get(("team", "recipes"), "pizza") is None
    assert store.search(("team",), query="yeast dough") == []
    store.delete(("team", "recipes"), "pizza")  # deleting what is gone is done
    store.delete(("team", "ops"), "deploy")
    assert ("team", "ops") not in store.list_namespaces()
    # Forgotten on every replica: no version is left for `recall --all` either.
    rows = store.client.run("recall", {"agent": "alpha", "query": "", "include_superseded": True}).data["memories"]
    assert {r["key"] for r in rows} == {"team/recipes/ramen", "home/note"}


@pytest.mark.parametrize("where", ["here", "serve"])
def test_delete_by_an_agent_that_may_not_forget_retires_the_item(tmp_path: Path, where: str):
    home = _init(tmp_path / "home", "alpha", "beta", bank="notes")
    with processes() as procs, MemmeshStore(
            procs.serve(home).start().wait_ready().home if where == "serve" else home,
            agent="alpha", bank="notes") as alpha:
        assert alpha.client.through_serve == (where == "serve")
        beta = MemmeshStore(alpha.client, agent="beta", bank="notes")  # one client, two agents
        alpha.put(("shared",), "plan", {"text": "ship on monday"})
        assert beta.get(("shared",), "plan") is not None
        beta.delete(("shared",), "plan")  # beta did not write it and is no Admin: forget is refused
        assert alpha.get(("shared",), "plan") is None and beta.get(("shared",), "plan") is None
        assert alpha.search(("shared",), query="monday") == []
        assert alpha.list_namespaces() == []
        alpha.put(("shared",), "plan", {"text": "ship on tuesday"})  # and the key can be used again
        item = beta.get(("shared",), "plan")
        assert item is not None and item.value == {"text": "ship on tuesday"}


def test_bank_mapping_by_first_label(tmp_path: Path):
    home = _init(tmp_path / "home", "alpha", bank="project-notes")
    with MemmeshStore(home, agent="alpha", bank={"team": "project-notes"}) as s:
        s.put(("team", "a"), "k", {"text": "in the bank"})
        s.put(("mine",), "k", {"text": "in alpha's own database"})
        bank = s.client.call_tool("alpha", "recall", {"query": "", "bank": "project-notes"})["memories"]
        own = s.client.call_tool("alpha", "recall", {"query": ""})["memories"]
        assert [m["key"] for m in bank] == ["team/a/k"] and [m["key"] for m in own] == ["mine/k"]
        assert s.list_namespaces() == [("mine",), ("team", "a")]
        assert [i.key for i in s.search(())] == ["k", "k"]


def test_what_the_store_refuses_it_refuses_in_one_line(store: MemmeshStore):
    with pytest.raises(InvalidNamespaceError):
        store.put(("a.b",), "k", {"v": 1})
    with pytest.raises(InvalidNamespaceError, match="non-empty string without"):  # ops given to batch directly
        store.batch([PutOp(("a.b",), "k", {"v": 1})])
    with pytest.raises(InvalidNamespaceError, match="at most 30 labels"):
        store.put(tuple(f"l{i}" for i in range(31)), "k", {"v": 1})
    with pytest.raises(ValueError, match="at most 512 characters"):
        store.put(("a",), "k" * 600, {"v": 1})
    with pytest.raises(ValueError, match="not JSON"):
        store.put(("a",), "k", {"v": float("nan")})
    with pytest.raises(ValueError, match="a JSON object"):
        store.batch([PutOp(("a",), "k", ["not", "a", "dict"])])  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError):
        store.put(("a",), "k", {"v": 1}, ttl=5)
    with pytest.raises(Exception, match="no agent named .nobody.") as unknown:
        MemmeshStore(store.client, agent="nobody").put(("a",), "k", {"v": 1})
    assert "\n" not in str(unknown.value)
    assert store.list_namespaces() == []  # nothing was written


def test_abatch_runs_every_operation_in_order(store: MemmeshStore):
    async def main() -> list[Any]:
        await store.aput(("docs",), "one", {"text": "the first document about apples"})
        return await store.abatch([
            PutOp(("docs",), "two", {"text": "the second document about pears"}),
            GetOp(("docs",), "one"),
            SearchOp(("docs",), query="pears"),
            PutOp(("docs",), "one", None),
            GetOp(("docs",), "one"),
        ])

    put, got, found, deleted, gone = asyncio.run(main())
    assert put is None and deleted is None and gone is None
    assert got.value == {"text": "the first document about apples"}
    assert [i.key for i in found] == ["two"]
    assert asyncio.run(store.alist_namespaces()) == [("docs",)]


def test_an_async_graph_uses_the_async_api(store: MemmeshStore):
    async def chat(state: State, *, store: BaseStore) -> State:
        namespace = ("users", state["user"])
        if state["text"].startswith("remember "):
            await store.aput(namespace, "fact", {"text": state["text"].removeprefix("remember ")})
            return {"answer": []}
        return {"answer": [i.value["text"] for i in await store.asearch(namespace, query=state["text"])]}

    builder = StateGraph(State)
    builder.add_node("chat", chat)
    builder.add_edge(START, "chat")
    graph = builder.compile(checkpointer=InMemorySaver(), store=store)

    async def main() -> list[str]:
        await graph.ainvoke({"user": "u1", "text": "remember the office is in lyon"},
                            {"configurable": {"thread_id": "a"}})
        out = await graph.ainvoke({"user": "u1", "text": "where is the office"}, {"configurable": {"thread_id": "b"}})
        return list(out["answer"])

    assert asyncio.run(main()) == ["the office is in lyon"]


# ---------------------------------------------------------------------- two nodes
@pytest.mark.slow
def test_a_second_node_that_imported_the_bank_sees_the_items(tmp_path: Path):
    a = _init(tmp_path / "a", "alpha", bank="project-notes")
    b = _init(tmp_path / "b")
    with processes() as procs:
        sa = procs.serve(a, interval=1).start()
        sb = procs.serve(b, interval=1).start()
        sa.wait_ready(), sb.wait_ready()
        ticket = sa.run("memory.share", {"bank": "project-notes", "perm": "admin"}).data["ticket"]
        sb.run("memory.import", {"ticket": ticket, "perm": "admin"})
        sb.run("agent.new", {"name": "gamma"})
        sb.run("memory.grant", {"bank": "project-notes", "agent": "gamma", "perm": "write"})

        with MemmeshStore(a, agent="alpha", bank={"team": "project-notes"}) as on_a, \
                MemmeshStore(b, agent="gamma", bank={"team": "project-notes"}) as on_b:
            assert on_a.client.through_serve and on_b.client.through_serve
            _graph(on_a).invoke({"user": "u1", "text": "remember my editor is vim"},
                                {"configurable": {"thread_id": "t1"}})
            on_a.put(("team", "decisions"), "db", {"text": "we keep SQLite", "by": "alpha"})
            on_a.put(("private",), "x", {"text": "alpha's own, never shared"})

            def seen_on_b() -> Any:
                return on_b.get(("team", "decisions"), "db")

            item = until(seen_on_b, 60, "alpha's item to reach node B")
            assert item.value == {"text": "we keep SQLite", "by": "alpha"}
            assert [i.key for i in on_b.search(("team",), query="sqlite")] == ["db"]
            assert on_b.list_namespaces() == [("team", "decisions")]  # the graph's user namespace is alpha's own
            # And back: gamma's write on B reaches A's store.
            on_b.put(("team", "decisions"), "ci", {"text": "CI runs on every push", "by": "gamma"})
            back = until(lambda: on_a.get(("team", "decisions"), "ci"), 60, "gamma's item to reach node A")
            assert back.value["by"] == "gamma"
            written = on_a.client.call_tool("alpha", "recall", {"query": "push", "bank": "project-notes"})
            assert [m["written_by"] for m in written["memories"]] == [
                sb.run("agent.list", {}).data["agents"][0]["key"]]  # signed by gamma's key


def test_search_pages_past_the_first_hundred_and_filters_over_them(shared_store: MemmeshStore):
    ns = ("deep", "pages")
    for i in range(130):
        shared_store.put(ns, f"item-{i:03d}", {"n": i, "even": i % 2 == 0, "text": f"a fact numbered {i}"})
    newest = [it.key for it in shared_store.search(ns, limit=100)]
    deeper = [it.key for it in shared_store.search(ns, limit=50, offset=100)]
    assert newest + deeper == [f"item-{i:03d}" for i in reversed(range(130))]
    # a filter keeps items found past recall's first page too
    odd_low = shared_store.search(ns, filter={"even": False, "n": {"$lt": 20}}, limit=20)
    assert sorted(it.value["n"] for it in odd_low) == list(range(1, 20, 2))
