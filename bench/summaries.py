"""History summaries (issue 12): do level-1 summaries keep the turns later questions need?

Usage::

    python bench/summaries.py [--data locomo|chitchat] [--locomo PATH] [--ratio R] [--seeds N]
                              [--via commands|service] [--turns N] [--session-turns N]
                              [--long-turns N] [--long-adds N] [--windows N] [--budget B,B]
                              [--max-add-seconds S] [--skip-quality] [--skip-speed] [--quick]
                              [--json PATH]

A quick run: ``--quick`` (3 random seeds; 5,000 turns added, a 5,000-turn long session).

**Data.** LoCoMo (Maharana et al., ACL 2024, "Evaluating Very Long-Term Conversational
Memory of LLM Agents"; CC BY-NC 4.0): ten long two-person conversations of 19-32 sessions,
with 1,986 questions whose ``evidence`` names the dialogue turns (``D<session>:<turn>``)
that answer them. It is in no package registry, and its licence forbids committing it
here: put ``data/locomo10.json`` of the LoCoMo repository (snap-research/locomo on GitHub)
at ``bench/.cache/locomo10.json`` (gitignored) or pass ``--locomo PATH``. Its SHA-256 is
recorded in the JSON. Without it the script says so and runs ``--data chitchat``, a proxy:

* ``chitchat`` (chitchat-dataset, the ``bench`` extra, MIT): each conversation is one
  session; a turn counts as *needed* when it shares a rare content word (at most
  ``RARE_DF`` turns of the whole corpus contain it) with a turn of a later batch of the
  same conversation, that later turn standing in for the question. This is a **proxy**,
  and one built from the very signal the IDF-density summariser ranks by (rare words), so
  it flatters that summariser; only the LoCoMo figure measures the claim.

**Harness** (the same for every method). Sessions are cut into level-1 batches of 10 turns
in order, as node/history does; the trailing batch of fewer than 10 turns of a session is
not summarised (those turns stay raw in the window) and its needed turns are left out of
the denominator (counted in the JSON). Per batch: the sentences of each turn's text
(``node.history.summary.split_sentences``; a sentence never spans two turns), the word
budget ``budget_for(words of the batch, ratio)`` (30 % by default), and each method's
order of preference over the sentences, filled greedily: a sentence is taken when its
words fit in what is left, otherwise skipped. When nothing fits, the method's first
choice counts as kept (``summarise`` then keeps its first words). Methods:

* ``memmesh``: ``node.history.summary.select`` (IDF density); the harness checks, per
  batch, that the chosen sentences joined are exactly the chunk summary the pyramid stores
  (``node.history.pyramid.summarise_level1``; ``summarise(texts, ratio)`` at another ratio);
* ``textrank``: Mihalcea and Tarau (2004), the sentence version: a graph of the batch's
  sentences, edge weight ``|common content words| / (log |S_i| + log |S_j|)`` (|S|: words
  of the sentence; content words: ``tokenize`` minus ``STOPWORDS``, standing in for the
  paper's open-class filter; no edge when the denominator is 0, i.e. two one-word
  sentences), weighted PageRank with damping 0.85 iterated until no score moves by more
  than 1e-6, best score first, ties to the earlier sentence;
* ``random``: a seeded shuffle of the sentences (``--seeds`` seeds, mean and standard
  deviation over them).

A needed turn is *kept* when the summary keeps at least one of its sentences (``any``, the
issue's measure). Stricter ones: ``all`` (every sentence of the turn kept), ``need words``
(the share of the needed turns' words kept; the budget is 30 % of all words, so above
0.30 means the method aims at them), ``answer sent`` (per question and evidence turn, the
turn's sentence sharing the most content words with the annotated answer is kept), and
per question: every evidence turn kept / at least one. As the base rate: the share of all
turns kept and of the words used; a method that picks short sentences touches more turns,
so ``needed kept`` must be read against ``turns kept``. LoCoMo per question category too
(1-4 headline, 5 = adversarial shown apart, as the LoCoMo papers do).

**Speed** (real nodes: ``Node.open`` of a temporary home, one agent, no embedder), through
the history commands (``node.run("history.add" | "history.compact" | "history.window")``) or,
with ``--via service``, the node.history.service functions they call:

* ``history.add``: ``--turns`` turns (default 100,000; distinct Chit-Chat messages, roles
  alternating user / assistant) one call each, in sessions of ``--session-turns`` (1,000),
  stopped after ``--max-add-seconds``: turns per second overall and per block, latency
  percentiles, p50 by position in the session; the agent's ``recall`` and ``auto_recall``
  p50 before and after (its memory is empty: what the history rows in the same database
  cost them); ``history.window`` on the first session;
* a long session in a second node: ``--long-turns`` turns (default 100,000) written in bulk
  (the rows ``add_turn`` writes, 200 turns per signed entry), then ``history.compact``
  (timed), ``history.window`` (first call, then ``--windows`` calls: p50 / p99, items per
  level) at each ``--budget``, ``--long-adds`` timed adds into it, and the first window
  after reopening the node.

``gc.collect(); gc.freeze()`` before timed loops, ``OPENBLAS_NUM_THREADS=1``.

Prints a table; writes JSON (default ``bench/results/summaries.json``).
"""
from __future__ import annotations

import os

# Before numpy (imported below, directly and by every project module): one BLAS thread.
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import gc  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from importlib.metadata import version  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from _common import machine, need, pct  # noqa: E402

from memmesh.node.history.pyramid import summarise_level1  # noqa: E402
from memmesh.node.history.summary import DEFAULT_RATIO, budget_for, rank, select, split_sentences, summarise, word_count  # noqa: E402
from memmesh.node.history.summary import fill as summary_fill  # noqa: E402
from memmesh.node.memory.tokens import STOPWORDS, tokenize  # noqa: E402

CACHE = HERE / ".cache"
LOCOMO_FILE = CACHE / "locomo10.json"
LOCOMO_SHA256 = "79fa87e90f04081343b8c8debecb80a9a6842b76a7aa537dc9fdf651ea698ff4"
BATCH = 10  # turns per level-1 chunk (issue 12)
RARE_DF = 20  # chitchat proxy: a word in at most this many turns of the corpus is rare
DAMPING = 0.85
AGENT = "alpha"

Order = Callable[[Sequence[str]], list[int]]  # sentences -> indexes, most preferred first


# ---------------------------------------------------------------------------- data

@dataclass
class Turn:
    tid: str  # the dataset's id (LoCoMo dia_id, normalised "D<s>:<n>")
    text: str


@dataclass
class Question:
    category: str
    evidence: list[str]  # turn ids
    answer: str = ""  # LoCoMo's answer (adversarial_answer for category 5); "" for the proxy


@dataclass
class Corpus:
    name: str
    sessions: list[list[Turn]]
    questions: list[Question]
    info: dict[str, Any] = field(default_factory=dict)


_DIA = re.compile(r"D:?(\d+):(\d+)")


def dia_ids(raw: object) -> list[str]:
    """Every ``D<s>:<n>`` in one evidence string, normalised (the data has "D8:6; D9:17",
    "D:11:26" and "D30:05"): the annotation is lenient, the parsing must be too."""
    return [f"D{int(s)}:{int(n)}" for s, n in _DIA.findall(str(raw))]


def load_locomo(path: Path) -> Corpus:
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    sessions: list[list[Turn]] = []
    questions: list[Question] = []
    unresolved = 0
    for conv in json.loads(raw):
        c = conv["conversation"]
        sid = conv["sample_id"]
        nums = sorted(int(k.split("_")[1]) for k in c if re.fullmatch(r"session_\d+", k) and isinstance(c[k], list))
        known: set[str] = set()
        for n in nums:
            turns = []
            for t in c[f"session_{n}"]:
                ids = dia_ids(t.get("dia_id", ""))
                tid = f"{sid}/{ids[0]}" if ids else f"{sid}/?"
                known.add(tid)
                turns.append(Turn(tid, str(t.get("text", ""))))
            sessions.append(turns)
        for q in conv["qa"]:
            ev = []
            for e in q.get("evidence") or []:
                for d in dia_ids(e):
                    if f"{sid}/{d}" in known:
                        ev.append(f"{sid}/{d}")
                    else:
                        unresolved += 1
            answer = q.get("answer", q.get("adversarial_answer", ""))
            questions.append(Question(str(q.get("category")), sorted(set(ev)), str(answer or "")))
    return Corpus("locomo", sessions, questions, {
        "name": "LoCoMo (locomo10.json)", "licence": "CC BY-NC 4.0",
        "source": "data/locomo10.json of the LoCoMo repository (snap-research/locomo)",
        "sha256": digest, "sha256_expected": digest == LOCOMO_SHA256,
        "evidence_ids_unresolved": unresolved})


def load_chitchat() -> Corpus:
    chitchat = need("chitchat_dataset", "chitchat-dataset", "summaries")
    sessions = []
    for ci, conv in enumerate(chitchat.ConversationDataset()):
        turns = [Turn(f"c{ci}/{i}", m) for i, m in enumerate(conv) if m.strip()]
        if turns:
            sessions.append(turns)
    words = [[frozenset(w for w in tokenize(t.text) if w not in STOPWORDS) for t in s] for s in sessions]
    df: dict[str, int] = {}
    for s in words:
        for ws in s:
            for w in ws:
                df[w] = df.get(w, 0) + 1
    questions = []
    for s, ws in zip(sessions, words):
        # A later turn of a later batch that repeats a rare word of turn i "asks" for turn i.
        for j in range(BATCH, len(s)):
            rare_j = {w for w in ws[j] if df[w] <= RARE_DF}
            if not rare_j:
                continue
            ev = [s[i].tid for i in range(j - j % BATCH) if rare_j & ws[i]]
            if ev:
                questions.append(Question("proxy", ev))
    return Corpus("chitchat", sessions, questions, {
        "name": f"Chit-Chat (chitchat-dataset {version('chitchat-dataset')})", "licence": "MIT",
        "proxy": f"needed = shares a content word found in <= {RARE_DF} turns of the corpus "
                 "with a turn of a later batch of the same conversation"})


# ---------------------------------------------------------------------------- methods

def content(s: str) -> frozenset[str]:
    return frozenset(w for w in tokenize(s) if w not in STOPWORDS)


def textrank_order(sentences: Sequence[str]) -> list[int]:
    """Mihalcea & Tarau (2004) sentence extraction: weighted PageRank over word overlap."""
    n = len(sentences)
    if n == 0:
        return []
    words = [content(s) for s in sentences]
    logs = [math.log(max(word_count(s), 1)) for s in sentences]
    w = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            den = logs[i] + logs[j]
            if den > 0:
                ov = len(words[i] & words[j])
                if ov:
                    w[i, j] = w[j, i] = ov / den
    out = w.sum(axis=1)
    # m[i, j] = w[j, i] / out[j]: the share of j's weight that flows to i (w is symmetric,
    # so dividing column j by out[j] is it); a sentence with no edge passes none.
    cols = np.broadcast_to(out[None, :], w.shape)
    m = np.divide(w, cols, out=np.zeros_like(w), where=cols > 0)
    ws = np.ones(n)
    for _ in range(1000):
        new = (1 - DAMPING) + DAMPING * (m @ ws)
        done = np.abs(new - ws).max() < 1e-6
        ws = new
        if done:
            break
    q = np.round(ws * 1e9).astype(np.int64)  # fixed tie-break: a last-bit difference reorders nothing
    return sorted(range(n), key=lambda i: (-int(q[i]), i))


def fill(order: Sequence[int], sentences: Sequence[str], budget: int) -> list[int]:
    """The summariser's own greedy fill (``node.history.summary.fill``: take what fits, skip
    what does not) in another ranking's ``order``, with ``summarise``'s fallback."""
    chosen = summary_fill(order, sentences, budget)
    if not chosen and order:
        chosen = [order[0]]  # summarise keeps the first words of its first choice
    return chosen


# ---------------------------------------------------------------------------- harness

@dataclass
class Batch:
    sentences: list[str]
    owner: list[int]  # sentence -> index of its turn in ``turns``
    turns: list[Turn]
    budget: int
    words: int


def batches(corpus: Corpus, ratio: float) -> tuple[list[Batch], set[str]]:
    """Every complete batch of every session, and the ids of the turns left raw."""
    out, raw = [], set()
    for s in corpus.sessions:
        full = len(s) - len(s) % BATCH
        raw.update(t.tid for t in s[full:])
        for b in range(0, full, BATCH):
            turns = s[b:b + BATCH]
            sents, owner = [], []
            for k, t in enumerate(turns):
                for x in split_sentences(t.text):
                    sents.append(x)
                    owner.append(k)
            words = sum(word_count(x) for x in sents)
            out.append(Batch(sents, owner, turns, budget_for(words, ratio), words))
    return out, raw


def run_method(bs: list[Batch], chooser: Callable[[Batch], list[int]]) -> tuple[dict[str, list[bool]], int]:
    """Per turn id, which of its sentences the summary keeps; and the words used."""
    kept: dict[str, list[bool]] = {}
    used = 0
    for b in bs:
        chosen = set(chooser(b))
        used += min(b.budget, sum(word_count(b.sentences[i]) for i in chosen))
        for t in b.turns:
            kept[t.tid] = []
        for i, k in enumerate(b.owner):
            kept[b.turns[k].tid].append(i in chosen)
    return kept, used


def answer_targets(corpus: Corpus, bs: list[Batch], categories: Sequence[str]) -> list[tuple[str, list[int]]]:
    """(evidence turn, its sentences sharing the most content words with the answer) pairs.

    The finest measure the data allows: not "some sentence of the turn" but the sentence
    that holds the answer, found by word overlap with the annotated answer (questions whose
    answer shares no content word with an evidence turn give no pair for that turn)."""
    sents = {t.tid: [] for b in bs for t in b.turns}
    for b in bs:
        for i, k in enumerate(b.owner):
            sents[b.turns[k].tid].append(b.sentences[i])
    out = []
    for q in corpus.questions:
        if q.category not in categories or not q.answer:
            continue
        ans = content(q.answer)
        for e in q.evidence:
            if e not in sents or not ans:
                continue
            ov = [len(ans & content(x)) for x in sents[e]]
            best = max(ov, default=0)
            if best > 0:
                out.append((e, [i for i, v in enumerate(ov) if v == best]))
    return out


def score(corpus: Corpus, bs: list[Batch], raw: set[str], kept: dict[str, list[bool]], used: int,
          categories: Sequence[str], targets: list[tuple[str, list[int]]], turn_words: dict[str, list[int]]) -> dict[str, Any]:
    qs = [q for q in corpus.questions if q.category in categories]
    needed = sorted({e for q in qs for e in q.evidence if e not in raw})
    asked = [[e for e in q.evidence if e not in raw] for q in qs]
    asked = [a for a in asked if a]
    n_turns = sum(len(b.turns) for b in bs)
    words = sum(b.words for b in bs)
    need_words = sum(sum(turn_words[e]) for e in needed)
    need_kept_words = sum(w for e in needed for w, k in zip(turn_words[e], kept[e]) if k)

    def share(n: int, d: int) -> float:
        return n / d if d else 0.0
    return {
        "questions": len(asked),
        "questions_without_evidence": sum(1 for q in qs if not q.evidence),
        "questions_only_raw_evidence": sum(1 for q in qs if q.evidence and all(e in raw for e in q.evidence)),
        "needed_turns": len(needed),
        "needed_turns_raw": len({e for q in qs for e in q.evidence if e in raw}),
        "needed_kept_any": share(sum(any(kept[e]) for e in needed), len(needed)),
        "needed_kept_all": share(sum(bool(kept[e]) and all(kept[e]) for e in needed), len(needed)),
        "needed_words_kept": share(need_kept_words, need_words),
        "answer_pairs": len(targets),
        "answer_sentence_kept": share(sum(any(kept[e][i] for i in ix) for e, ix in targets), len(targets)),
        "questions_all_evidence_kept": share(sum(all(any(kept[e]) for e in a) for a in asked), len(asked)),
        "questions_some_evidence_kept": share(sum(any(any(kept[e]) for e in a) for a in asked), len(asked)),
        "base_turns_kept": share(sum(any(v) for v in kept.values()), n_turns),
        "base_words_used": share(used, words),
    }


def quality(corpus: Corpus, ratio: float, seeds: int) -> dict[str, Any]:
    bs, raw = batches(corpus, ratio)
    mismatches = 0

    def ours(b: Batch) -> list[int]:
        nonlocal mismatches
        chosen = select(b.sentences, b.budget)
        # What the pyramid stores as the chunk's summary (at its default ratio).
        texts = [t.text for t in b.turns]
        got = summarise_level1(texts) if ratio == DEFAULT_RATIO else summarise(texts, ratio)
        if chosen and got != " ".join(b.sentences[i] for i in chosen):
            mismatches += 1
        if not chosen and b.sentences:  # summarise's fallback: the first words of its best sentence
            chosen = [rank(b.sentences)[0]]
        return chosen

    def textrank(b: Batch) -> list[int]:
        return fill(textrank_order(b.sentences), b.sentences, b.budget)

    groups = {"locomo": {"1-4": ("1", "2", "3", "4"), "5 (adversarial)": ("5",),
                         **{c: (c,) for c in ("1", "2", "3", "4")}},
              "chitchat": {"proxy": ("proxy",)}}[corpus.name]
    targets = {g: answer_targets(corpus, bs, cats) for g, cats in groups.items()}
    turn_words: dict[str, list[int]] = {t.tid: [] for b in bs for t in b.turns}
    for b in bs:
        for i, k in enumerate(b.owner):
            turn_words[b.turns[k].tid].append(word_count(b.sentences[i]))
    results: dict[str, Any] = {}
    runs: dict[str, list[tuple]] = {"memmesh": [run_method(bs, ours)], "textrank": [run_method(bs, textrank)]}
    runs["random"] = []
    for seed in range(seeds):
        rnd = random.Random(seed)

        def rand(b: Batch, rnd: random.Random = rnd) -> list[int]:
            order = list(range(len(b.sentences)))
            rnd.shuffle(order)
            return fill(order, b.sentences, b.budget)
        runs["random"].append(run_method(bs, rand))
    for gname, cats in groups.items():
        results[gname] = {}
        for method, rs in runs.items():
            per = [score(corpus, bs, raw, *r, categories=cats, targets=targets[gname], turn_words=turn_words)
                   for r in rs]
            row = dict(per[0])
            if len(per) > 1:
                for k, v in per[0].items():
                    if isinstance(v, float):
                        vals = [p[k] for p in per]
                        row[k] = float(np.mean(vals))
                        row[k + "_std"] = float(np.std(vals))
            results[gname][method] = row
    return {"ratio": ratio, "batch_turns": BATCH, "random_seeds": seeds,
            "sessions": len(corpus.sessions), "turns": sum(len(s) for s in corpus.sessions),
            "batches": len(bs), "turns_in_batches": sum(len(b.turns) for b in bs),
            "sentences_in_batches": sum(len(b.sentences) for b in bs),
            "summarise_mismatches": mismatches, "groups": results}


# ---------------------------------------------------------------------------- speed

class Ops:
    """The history operations, through the registry commands when they exist (``history.add``,
    ``history.compact``, ``history.window``), else through node.history.service directly (the
    functions those commands call; the JSON says which)."""

    def __init__(self, node: Any, via: str = "commands") -> None:
        from memmesh.node.commands import REGISTRY

        self.node = node
        self.via = via
        if via == "commands":
            try:
                # Registers the commands even before node/commands/__init__.py imports the module.
                import memmesh.node.commands.history  # noqa: F401
                for name in ("history.add", "history.compact", "history.window"):
                    REGISTRY.get(name)
            except Exception:  # noqa: BLE001 - ImportError, UnknownCommand: not landed yet
                self.via = "service"

    def _agent(self) -> Any:
        return self.node.agents.agent(AGENT)

    def add(self, session: str, role: str, text: str) -> None:
        if self.via == "commands":
            self.node.run("history.add", {"agent": AGENT, "session": session, "role": role, "text": text})
        else:
            from memmesh.node.history.service import add_turn
            a = self._agent()
            add_turn(a.db, a.key, session, role, text)

    def compact(self) -> None:
        if self.via == "commands":
            self.node.run("history.compact", {"agent": AGENT})
        else:
            from memmesh.node.history.service import compact
            a = self._agent()
            compact(a.db, a.key)

    def window(self, session: str, budget: int) -> dict[str, Any]:
        if self.via == "commands":
            data = self.node.run("history.window", {"agent": AGENT, "session": session, "budget": budget}).data
        else:
            from memmesh.node.history.service import window
            data = window(self._agent().db, session, budget)
        return data if isinstance(data, dict) else {"text": str(data)}


def distinct_messages(n: int, seed: int) -> list[str]:
    chitchat = need("chitchat_dataset", "chitchat-dataset", "summaries")
    from memmesh.node.history.record import MAX_TEXT_CHARS

    # A few Chit-Chat messages are longer than a turn may be (history.add refuses them).
    msgs = [m for m in chitchat.MessageDataset() if m.strip() and len(m) <= MAX_TEXT_CHARS]
    random.Random(seed).shuffle(msgs)
    seen: set[str] = set()
    texts = [m for m in msgs if not (m in seen or seen.add(m))]
    if len(texts) < n:
        sys.exit(f"summaries: only {len(texts)} distinct Chit-Chat messages, {n} needed")
    return texts[:n]


def bulk_session(node: Any, session: str, texts: Sequence[str], per_entry: int = 200) -> float:
    """Write a long session's turn and text rows directly, ``per_entry`` turns per signed
    entry (the rows ``add_turn`` writes, without its per-turn compaction); seconds taken."""
    from memmesh.node.history.record import HISTORY_STORE, TEXT_STORE, text_hash, text_value, turn_value

    a = node.agents.agent(AGENT)
    t0 = time.perf_counter()
    for b in range(0, len(texts), per_entry):
        txn = a.db.transaction(a.key)
        for i, text in enumerate(texts[b:b + per_entry], start=b):
            digest = text_hash(text)
            txn.append(HISTORY_STORE, turn_value(session, i + 1, "user" if i % 2 == 0 else "assistant", digest))
            txn.append(TEXT_STORE, text_value(digest, text))
        txn.commit()
    return time.perf_counter() - t0


def time_windows(ops: Ops, session: str, budget: int, n: int) -> dict[str, Any]:
    t0 = time.perf_counter_ns()
    first = ops.window(session, budget)
    out: dict[str, Any] = {"first_ms": (time.perf_counter_ns() - t0) / 1e6}
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        ops.window(session, budget)
        samples.append(time.perf_counter_ns() - t0)
    text = first.get("text", "")
    if samples:
        out.update(pct(samples))
    out.update({"calls": n, "chars": len(text), "within_budget": len(text) <= budget,
                "turns": first.get("turns"), "raw_turns": first.get("raw_turns"),
                "items": len(first.get("items", [])),
                "items_by_level": {str(lv): sum(1 for i in first.get("items", []) if i.get("level") == lv)
                                   for lv in (0, 1, 2)}})
    return out


def fresh_node(home: Path) -> Any:
    from memmesh.node.library import Node

    node = Node.open(home)
    node.run("embedder.set", {"provider": "none"})
    node.run("agent.new", {"name": AGENT})
    return node


def time_recall(node: Any, queries: Sequence[str]) -> dict[str, Any]:
    """The agent's recall and auto-recall (its own memory, empty): what history in the same
    database costs them (both read the agent's config rows)."""
    out = {}
    for name, fn in (("recall", lambda q: node.call_tool(AGENT, "recall", {"query": q})),
                     ("auto_recall", lambda q: node.auto_recall(AGENT, [q]))):
        samples = []
        for q in queries:
            t0 = time.perf_counter_ns()
            fn(q)
            samples.append(time.perf_counter_ns() - t0)
        out[name] = pct(samples)
    return out


def speed(n_turns: int, session_turns: int, long_turns: int, long_adds: int, windows: int, budgets: list[int],
          seed: int, via: str, max_add_s: float) -> dict[str, Any]:
    """history.add throughput over ``n_turns`` turns and history.window on a ``long_turns``
    session, each in its own node (the texts are distinct within each, as Chit-Chat has only
    about 130k distinct messages)."""
    from memmesh.node.library import Node

    texts = distinct_messages(max(n_turns, long_turns + long_adds), seed)
    out: dict[str, Any] = {"turns": n_turns, "session_turns": session_turns, "window_budgets_chars": budgets}
    with tempfile.TemporaryDirectory(prefix="memmesh-bench-") as tmp:
        # 1. add: n_turns turns, sessions of session_turns turns one after another
        with fresh_node(Path(tmp) / "add") as node:
            ops = Ops(node, via)
            out["via"] = ops.via
            queries = [" ".join(t.split()[:4]) or "hello" for t in texts[-20:]]
            out["recall_before"] = time_recall(node, queries)
            gc.collect()
            gc.freeze()
            block = 10_000 if n_turns >= 50_000 else max(n_turns // 5, 1)
            per_block, samples = [], []
            by_pos: dict[int, list[int]] = {}  # position in its session // (session_turns // 10) -> ns
            decile = max(session_turns // 10, 1)
            t_all = t_block = time.perf_counter()
            added = 0
            for i, text in enumerate(texts[:n_turns]):
                if time.perf_counter() - t_all > max_add_s:
                    print(f"  history.add: stopped after {i:,} turns ({max_add_s:.0f} s, --max-add-seconds)",
                          file=sys.stderr, flush=True)
                    break
                t0 = time.perf_counter_ns()
                ops.add(f"s{i // session_turns}", "user" if i % 2 == 0 else "assistant", text)
                dt = time.perf_counter_ns() - t0
                samples.append(dt)
                added += 1
                by_pos.setdefault(i % session_turns // decile, []).append(dt)
                if (i + 1) % block == 0:
                    now = time.perf_counter()
                    per_block.append(round(block / (now - t_block), 1))
                    t_block = now
                    print(f"  history.add {i + 1:>7} turns: {per_block[-1]:,.0f}/s", file=sys.stderr, flush=True)
            out["turns_added"] = added
            out["add_stopped_early"] = added < n_turns
            out["add_per_s"] = added / (time.perf_counter() - t_all)
            out["add_per_s_by_block"] = {"block": block, "per_s": per_block}
            out["add_latency"] = pct(samples)
            out["add_p50_ms_by_session_position"] = {
                f"{k * decile}-{(k + 1) * decile - 1}": float(np.percentile(np.asarray(v) / 1e6, 50))
                for k, v in sorted(by_pos.items())}
            out["window_in_add_db"] = {str(b): time_windows(ops, "s0", b, windows) for b in budgets}
            out["recall_after"] = time_recall(node, queries)
            gc.unfreeze()
        # 2. one long session, written in bulk, then compacted, windowed, added to
        home = Path(tmp) / "long"
        with fresh_node(home) as node:
            ops = Ops(node, via)
            gc.collect()
            gc.freeze()
            print(f"  writing a {long_turns:,}-turn session in bulk", file=sys.stderr, flush=True)
            out["long_session_turns"] = long_turns
            out["long_bulk_write_s"] = bulk_session(node, "long", texts[:long_turns])
            t0 = time.perf_counter()
            ops.compact()
            out["long_compact_s"] = time.perf_counter() - t0
            out["window_long"] = {str(b): time_windows(ops, "long", b, windows) for b in budgets}
            adds = []
            for text in texts[long_turns:long_turns + long_adds]:
                t0 = time.perf_counter_ns()
                ops.add("long", "user", text)
                adds.append(time.perf_counter_ns() - t0)
            out["add_into_long_session"] = {"adds": len(adds), **(pct(adds) if adds else {})}
            gc.unfreeze()
        # 3. the first window of a freshly opened node (its history state read from the rows)
        with Node.open(home) as node:
            out["window_long_cold"] = time_windows(Ops(node, via), "long", budgets[0], 0)["first_ms"]
    return out


# ---------------------------------------------------------------------------- report

def print_quality(q: dict[str, Any], corpus: Corpus) -> None:
    print(f"data: {corpus.info['name']} ({corpus.info['licence']}); {q['sessions']} sessions, "
          f"{q['turns']} turns, {q['batches']} level-1 batches of {q['batch_turns']} "
          f"({q['turns_in_batches']} turns, {q['sentences_in_batches']} sentences); budget {q['ratio']:.0%} of words")
    if corpus.name == "chitchat":
        print("PROXY, not the real target: " + corpus.info["proxy"])
    print(f"chunk summaries (summarise_level1) that differ from the harness's memmesh selection: "
          f"{q['summarise_mismatches']}")
    for gname, rows in q["groups"].items():
        r0 = next(iter(rows.values()))
        print(f"\nquestions {gname}: {r0['questions']} questions, {r0['needed_turns']} needed turns in batches "
              f"({r0['needed_turns_raw']} needed turns left raw, {r0['questions_only_raw_evidence']} questions "
              f"only about raw turns, {r0['questions_without_evidence']} without evidence)")
        if r0["answer_pairs"]:
            print(f"  answer sentences: {r0['answer_pairs']} (question, evidence turn) pairs whose answer shares a word "
                  "with the turn")
        cols = [("needed kept", "needed_kept_any"), ("all sents", "needed_kept_all"),
                ("need words", "needed_words_kept"), ("answer sent", "answer_sentence_kept"),
                ("q all kept", "questions_all_evidence_kept"), ("q any kept", "questions_some_evidence_kept"),
                ("turns kept", "base_turns_kept"), ("words used", "base_words_used")]
        print(f"  {'method':10}" + "".join(f" {c:>11}" for c, _ in cols))
        for m, r in rows.items():
            sd = f"  (±{r['needed_kept_any_std']:.3f} over seeds)" if "needed_kept_any_std" in r else ""
            print(f"  {m:10}" + "".join(f" {r[k]:>11.3f}" if k != "answer_sentence_kept" or r["answer_pairs"]
                                        else f" {'-':>11}" for _, k in cols) + sd)


def print_speed(s: dict[str, Any]) -> None:
    lat = s["add_latency"]
    print(f"\nspeed (through {s['via']})")
    stop = f" (STOPPED after {s['turns_added']:,} of {s['turns']:,}: --max-add-seconds)" if s["add_stopped_early"] else ""
    print(f"history.add: {s['add_per_s']:,.0f} turns/s over {s['turns_added']:,} turns{stop} in sessions of "
          f"{s['session_turns']:,} (p50 {lat['p50_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms); "
          f"per {s['add_per_s_by_block']['block']:,}: {s['add_per_s_by_block']['per_s']}")
    print("  p50 ms by position in the session: "
          + ", ".join(f"{k} {v:.2f}" for k, v in s["add_p50_ms_by_session_position"].items()))
    print(f"long session: {s['long_session_turns']:,} turns written in bulk in {s['long_bulk_write_s']:.1f} s, "
          f"history.compact {s['long_compact_s']:.1f} s")
    print(f"  {'history.window':30} {'budget':>9} {'first ms':>9} {'p50 ms':>8} {'p99 ms':>8} {'chars':>8}"
          f" {'L2/L1/raw':>12} {'fits':>5}")
    for label, key in ((f"session of {s['session_turns']:,}", "window_in_add_db"),
                       (f"session of {s['long_session_turns']:,}", "window_long")):
        for b, w in s[key].items():
            print(f"  {label:30} {int(b):>9,} {w['first_ms']:>9.1f} {w['p50_ms']:>8.2f} {w['p99_ms']:>8.2f}"
                  f" {w['chars']:>8} {'/'.join(str(w['items_by_level'][k]) for k in ('2', '1', '0')):>12}"
                  f" {str(w['within_budget']):>5}")
    print(f"  first window after reopening the node (long session, budget {s['window_budgets_chars'][0]:,}): "
          f"{s['window_long_cold']:,.0f} ms")
    for when in ("before", "after"):
        r = s[f"recall_{when}"]
        print(f"agent's recall {when} the adds: p50 {r['recall']['p50_ms']:.2f} ms; "
              f"auto-recall p50 {r['auto_recall']['p50_ms']:.2f} ms")
    a = s["add_into_long_session"]
    if a["adds"]:
        print(f"history.add into it: p50 {a['p50_ms']:.1f} ms, max {a['max_ms']:.1f} ms ({a['adds']} adds)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", choices=["locomo", "chitchat"], default="locomo")
    ap.add_argument("--locomo", type=Path, default=LOCOMO_FILE)
    ap.add_argument("--ratio", type=float, default=0.3)
    ap.add_argument("--seeds", type=int, default=20, help="random-selection seeds (default 20)")
    ap.add_argument("--turns", type=int, default=100_000, help="turns added one by one (default 100,000)")
    ap.add_argument("--session-turns", type=int, default=1_000, help="turns per session while adding (default 1,000)")
    ap.add_argument("--long-turns", type=int, default=100_000, help="turns of the long session (default 100,000)")
    ap.add_argument("--long-adds", type=int, default=20, help="turns then added to the long session, timed")
    ap.add_argument("--windows", type=int, default=50)
    ap.add_argument("--budget", default="8000,200000",
                    help="history.window budgets in characters, comma-separated (default 8000,200000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-add-seconds", type=float, default=1800.0,
                    help="stop adding after this long (default 1800; the JSON says how many were added)")
    ap.add_argument("--via", choices=["commands", "service"], default="commands",
                    help="the history commands (node.run), or node.history.service directly (what they call)")
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--quick", action="store_true", help="3 seeds; 5,000 turns; a 5,000-turn long session; 20 windows")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "summaries.json")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.turns, args.long_turns, args.windows, args.long_adds = 3, 5_000, 5_000, 20, 5

    from recall import git_state

    result: dict[str, Any] = {"date": datetime.now(UTC).strftime("%Y-%m-%d"), "machine": machine(),
                              "git": git_state(), "quick": args.quick}
    if not args.skip_quality:
        data = args.data
        if data == "locomo" and not args.locomo.is_file():
            print(f"summaries: {args.locomo} not found. LoCoMo (CC BY-NC 4.0) is in no package registry and "
                  "may not be committed: put data/locomo10.json of the LoCoMo repository (snap-research/locomo) "
                  "there, or pass --locomo PATH. Running the Chit-Chat PROXY instead.", file=sys.stderr)
            data = "chitchat"
        corpus = load_locomo(args.locomo) if data == "locomo" else load_chitchat()
        if corpus.name == "locomo" and not corpus.info["sha256_expected"]:
            print(f"summaries: {args.locomo} is not the file these figures were measured on "
                  f"(SHA-256 {corpus.info['sha256']})", file=sys.stderr)
        t0 = time.perf_counter()
        q = quality(corpus, args.ratio, args.seeds)
        q["seconds"] = time.perf_counter() - t0
        result["data"] = corpus.info
        result["quality"] = q
        print_quality(q, corpus)
    if not args.skip_speed:
        print(f"\nspeed: {args.turns:,} turns in sessions of {args.session_turns:,}, then a "
              f"{args.long_turns:,}-turn session", file=sys.stderr)
        budgets = [int(b) for b in args.budget.split(",") if b.strip()]
        s = speed(args.turns, args.session_turns, args.long_turns, args.long_adds, args.windows, budgets,
                  args.seed, args.via, args.max_add_seconds)
        result["speed"] = s
        print_speed(s)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
