"""The indexes of one memory view over its docs, and the ranking recall runs on them.

Ranking (docs/memory.md, exactly)
    * Document text ``key + " " + value + " " + " ".join(tags)``, tokens as in
      :mod:`node.memory.tokens`; BM25 (k1=1.5, b=0.75) over the *current* rows only: N, df and
      avgdl describe current rows. Rows matching no query token are not in the lexical list.
    * Tags are an AND filter compared case-insensitively (``str.casefold``): a row passes when
      every requested tag is among its tags.
    * A query with no tokens (empty, or only one-character/punctuation words) returns current
      memories by recency: T order, newest first. The tag filter still applies.
    * Hybrid: when a query vector is given and the active embeddings store holds vectors of the
      query's length, the cosine list (non-positive dropped, :class:`VectorIndex`) and the BM25
      list, each taken to depth ``max(limit, 100)`` after the filters, are fused by Reciprocal
      Rank Fusion with k=60 and cut to ``limit``. Rows without a vector appear only in the BM25
      list; rows with a vector but no matching token only in the cosine list. Without a usable
      query vector (none given, no active store, no vector of that length) the ranking is plain
      BM25; that fallback never errors.
    * Ties (bitwise-equal scores) are broken by T order, newest first
      (:func:`node.memory.rows.order_desc_key`), never by the local doc id, so every replica
      holding the same entries returns the same list.

One set of docs, several indexes (:class:`RecallIndex`)
    Every well-formed memory row is a *doc* (a local int, never leaving this module), current
    or not, kept until the next rebuild. Over them:

    * one BM25 index of every doc (:class:`InvertedIndex`; its statistics are the whole
      history's, used by ``as_of``, ``as_known_at`` and ``include_superseded``), and a
      :class:`Subset` of it, the current docs, with the current rows' own statistics (plain
      recall): the postings are held once;
    * vectors in two blocks per vector length: the current docs' (``vectors``, what plain recall
      multiplies) and the other docs' (``old_vectors``); a row that stops being current moves its
      vector rows across, bit for bit. Time-aware recall searches both blocks and merges them;
    * per-doc columns (:mod:`node.memory.columns`): filters are boolean masks computed in one
      vectorised pass (:meth:`Filters.mask`) and handed to BM25 and the cosine, not a Python call
      per candidate;
    * the timelines of all keys as flat arrays (:mod:`node.memory.timetable`): ``as_of`` and
      ``as_known_at`` are vectorised group maxima over them;
    * the backlink index (:mod:`node.memory.backlinks`): the current rows by the keys their
      links may name, for ``neighbors``.

    Each is updated by the rows that arrive; nothing is dropped on a write.
"""
from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

import numpy as np

from .backlinks import Backlinks
from .bm25 import InvertedIndex, Subset
from .columns import DocColumns
from .fusion import RRF_K, rank_candidates, rrf
from .labels import Labels, row_labels
from .multimap import IntMultiMap
from .order_columns import OrderColumns
from .row_table import DescKeys, RowTable
from .rows import Memory, normalized_value
from .str_ids import StrIds
from .tokens import document_text, tokenize
from .vectors import VectorIndex

RRF_DEPTH = 100  # each list is taken to depth max(limit, RRF_DEPTH) before fusion

Order = tuple[int, str, int]  # a row's T order (RowRecord.order)
_EMPTY: frozenset[int] = frozenset()


def _above(floor: float, lexical: list[tuple[int, float]],
           semantic: list[tuple[int, float]]) -> Callable[[int], bool] | None:
    """Which fused docs count: every BM25 match, and a cosine-only match from ``floor`` up
    (docs/memory.md, "Relevance floor"); None when the floor lets every cosine through."""
    if floor <= 0.0 or all(s >= floor for _, s in semantic):
        return None
    keep = {d for d, _ in lexical}
    keep.update(d for d, s in semantic if s >= floor)
    return keep.__contains__


def text_key(text: str) -> int:
    """A hash of ``text`` that is the same in every process (CRC-32 of its UTF-8)."""
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


def _tokens(m: Memory) -> list[str]:
    return tokenize(document_text(m.key, m.value, m.tags))


class RecallIndex:
    """Every well-formed row of a view (its docs) and the indexes over them (the module docstring)."""

    def __init__(self, vector_index: Callable[[int], VectorIndex] = VectorIndex) -> None:
        """``vector_index``: makes the vector block of a length (tests pass a lower quantised
        threshold through it)."""
        self._vector_index = vector_index
        self.mem = RowTable()  # doc -> its memory
        self.row_doc = StrIds()  # row key -> doc (docs are numbered as rows arrive)
        self.tag_docs: dict[str, set[int]] = {}  # casefolded tag -> docs carrying it
        self.entity_docs: dict[str, set[int]] = {}  # casefolded entity -> docs about it
        # text_key of the normalised value -> docs saying it: remember's same-text check is a
        # lookup, not a scan of the bank (node/memory/dedup.py); rebuilt with the index, so a
        # forgotten value leaves it with the rest. A stable hash, not hash(): a view snapshot
        # (node/memory/snapshot.py) is read back by another process.
        self.text_docs = IntMultiMap()
        self.cols = DocColumns()
        self.all_bm25 = InvertedIndex()  # every doc: whole-history statistics
        self.bm25 = Subset(self.all_bm25)  # the current docs, with their own statistics
        self.vectors: dict[int, VectorIndex] = {}  # vector length -> the current docs' vectors
        self.old_vectors: dict[int, VectorIndex] = {}  # vector length -> the other docs' vectors
        self.vec_order: dict[int, OrderColumns] = {}  # length -> doc -> order of its vector's row
        self.links = Backlinks()
        self.secret_of: dict[int, str] = {}  # doc -> why it is a secret (few docs)
        self.flagged = 0  # docs with a hygiene flag
        self.ingested = 0  # docs of an ingested source
        self.derived = 0  # docs of source derived (auto-capture)
        self.scored = 0  # docs with an importance or a confidence (docs/memory.md, "Importance and confidence")

    @property
    def tiebreak(self) -> DescKeys:
        """doc -> order_desc_key of its row (node/memory/rows.py): what rankings break ties with."""
        return self.mem.desc_keys

    def _count(self, doc: int, labels: Labels) -> None:
        if labels.secret is not None:
            self.secret_of[doc] = labels.secret
        self.flagged += labels.flag is not None
        self.ingested += labels.ingested
        self.derived += labels.derived

    # ------------------------------------------------------------------ docs
    def add(self, m: Memory, seq: int) -> int:
        labels = row_labels(m)
        doc = self.cols.append(m, seq, labels)
        self._count(doc, labels)
        self.mem.append(m)
        if self.row_doc.add(m.row_key) != doc:
            raise ValueError(f"row {m.row_key!r} is already a doc of this view")
        for tag in {t.casefold() for t in m.tags}:
            self.tag_docs.setdefault(tag, set()).add(doc)
        self._about(doc, m)
        self._said(doc, m)
        self.all_bm25.add(doc, _tokens(m))
        return doc

    def _said(self, doc: int, m: Memory) -> None:
        self.text_docs.add(text_key(normalized_value(m.value)), doc)

    def _about(self, doc: int, m: Memory) -> None:
        for entity in {e.casefold() for e in m.entities}:
            self.entity_docs.setdefault(entity, set()).add(doc)
        self.scored += m.importance is not None or m.confidence is not None

    def add_many(self, mems: Sequence[Memory], seqs: Sequence[int]) -> None:
        """``add`` of each memory in turn (docs n, n + 1, ...), in bulk."""
        first = self.cols.n
        docs = range(first, first + len(mems))
        labels = [row_labels(m) for m in mems]
        self.cols.extend(mems, seqs, labels)
        for doc, lab in zip(docs, labels):
            if lab.secret is not None or lab.flag is not None or lab.ingested or lab.derived:
                self._count(doc, lab)
        self.mem.extend(mems)
        self.row_doc.extend([m.row_key for m in mems])
        tag_docs = self.tag_docs
        for doc, m in zip(docs, mems):
            for tag in {t.casefold() for t in m.tags}:
                docs_of = tag_docs.get(tag)
                if docs_of is None:
                    tag_docs[tag] = {doc}
                else:
                    docs_of.add(doc)
            if m.entities or m.importance is not None or m.confidence is not None:
                self._about(doc, m)
            self._said(doc, m)
        self.all_bm25.add_many((doc, _tokens(m)) for doc, m in zip(docs, mems))

    def make_current(self, doc: int) -> None:
        """A doc is current from its arrival or never (until a rebuild), so it has no vectors
        yet: they are indexed after this, into the current block."""
        self.cols.current[doc] = True
        self.bm25.add(doc)
        self.links.add(doc, self.mem[doc])

    def make_current_many(self, docs: Sequence[int]) -> None:
        """``make_current`` of docs that have no vectors yet, in bulk."""
        self.cols.current[list(docs)] = True
        self.bm25.add_many(docs)
        for doc in docs:
            self.links.add(doc, self.mem[doc])

    def retire(self, doc: int) -> None:
        """The doc is no longer current: its vectors move to the other block."""
        self.cols.current[doc] = False
        self.bm25.remove(doc)
        self.links.remove(doc, self.mem[doc])
        for dim, index in self.vectors.items():
            if doc in self.vec_order[dim]:
                self._move(doc, index, self._block(self.old_vectors, dim))

    @staticmethod
    def _move(doc: int, source: VectorIndex, target: VectorIndex) -> None:
        unit = source.vector(doc)
        source.remove(doc)
        target.add_unit(doc, unit)

    def _block(self, blocks: dict[int, VectorIndex], dim: int) -> VectorIndex:
        index = blocks.get(dim)
        if index is None:
            index = blocks[dim] = self._vector_index(dim)
        return index

    # ------------------------------------------------------------------ vectors
    def index_vectors(self, best: dict[tuple[int, int], tuple[Order, np.ndarray]]) -> None:
        """``index_vector`` of each ``(doc, length) -> (order, vec)`` (at most one vector per
        doc and length, none indexed yet), one bulk load per block and length."""
        current = self.cols.current
        by_block: dict[tuple[bool, int], tuple[list[int], list[np.ndarray]]] = {}
        orders: dict[int, tuple[list[int], list[Order]]] = {}
        for (doc, dim), (order, vec) in best.items():
            docs, vecs = by_block.setdefault((bool(current[doc]), dim), ([], []))
            docs.append(doc)
            vecs.append(vec)
            of_dim = orders.setdefault(dim, ([], []))
            of_dim[0].append(doc)
            of_dim[1].append(order)
        for dim, (docs, of) in orders.items():
            self.vec_order.setdefault(dim, OrderColumns()).scatter(docs, of)
        for (is_current, dim), (docs, vecs) in sorted(by_block.items()):
            self._block(self.vectors if is_current else self.old_vectors, dim).add_many(docs, vecs)

    def index_vector(self, doc: int, order: Order, vec: np.ndarray) -> None:
        """Index ``vec`` for ``doc`` unless a newer vector of that length is indexed."""
        dim = len(vec)
        prev = self.vec_order[dim].get(doc) if dim in self.vec_order else None
        if prev is not None and prev >= order:
            return
        index = self._block(self.vectors if self.cols.current[doc] else self.old_vectors, dim)
        if prev is not None:
            index.remove(doc)
        index.add(doc, vec)
        self.vec_order.setdefault(dim, OrderColumns()).set(doc, order)

    def has_vector(self, doc: int, dim: int | None) -> bool:
        if dim is not None:
            return dim in self.vec_order and doc in self.vec_order[dim]
        return any(doc in index for index in self.vectors.values())

    # ------------------------------------------------------------------ ranking
    def rank(self, tokens: list[str], need: frozenset[str], limit: int, query_vector: np.ndarray | None,
             history: bool, mask: np.ndarray | None, floor: float = 0.0,
             about: frozenset[str] = frozenset()) -> list[tuple[Memory, float]]:
        """``history``: rank among every doc with the whole history's statistics (else among
        the current docs with theirs); ``mask``: only the docs where it is true; ``floor``: a
        doc the cosine list found and BM25 did not, with a cosine below it, is no result (the
        lists are fused as they are, so what is returned ranks exactly as without a floor);
        ``need``/``about``: only the docs carrying every one of these tags / entities."""
        n = self.cols.n
        for wanted, docs_of in ((need, self.tag_docs), (about, self.entity_docs)):
            if not wanted:
                continue
            # AND filter: the docs carrying every requested tag or entity (smallest set first).
            sets = sorted((docs_of.get(t, _EMPTY) for t in wanted), key=len)
            permitted = sets[0] if len(sets) == 1 else sets[0].intersection(*sets[1:])
            if not permitted:
                return []
            tagged = np.zeros(n, dtype=bool)
            tagged[np.fromiter(permitted, dtype=np.int64, count=len(permitted))] = True
            mask = tagged if mask is None else mask & tagged
        tiebreak = self.tiebreak.__getitem__
        if not tokens:
            if not history:
                mask = self.cols.current[:n] if mask is None else mask & self.cols.current[:n]
            ids = np.arange(n, dtype=np.int64) if mask is None else np.flatnonzero(mask)
            hits = rank_candidates(ids, self.cols.height[ids], limit=limit, tiebreak=tiebreak)
        else:
            lexical_index: InvertedIndex | Subset = self.all_bm25 if history else self.bm25
            blocks = [] if query_vector is None else [
                b for b in (self.vectors.get(len(query_vector)),
                            self.old_vectors.get(len(query_vector)) if history else None)
                if b is not None and len(b)]
            if not blocks or query_vector is None:  # no vector, no blocks
                hits = lexical_index.search(tokens, limit=limit, tiebreak=tiebreak, mask=mask)
            else:
                depth = max(limit, RRF_DEPTH)
                lexical = lexical_index.search(tokens, limit=depth, tiebreak=tiebreak, mask=mask)
                semantic = blocks[0].search(query_vector, limit=depth, tiebreak=tiebreak, mask=mask)
                if len(blocks) > 1:
                    # Each block's best, then the best of both: the same list as one block of
                    # all rows (scores are exact float64, whatever block a row is in).
                    more = blocks[1].search(query_vector, limit=depth, tiebreak=tiebreak, mask=mask)
                    both = semantic + more
                    semantic = rank_candidates([d for d, _ in both], [s for _, s in both], limit=depth,
                                               tiebreak=tiebreak)
                if semantic:
                    hits = rrf([[d for d, _ in lexical], [d for d, _ in semantic]], RRF_K,
                               limit=limit, tiebreak=tiebreak, allowed=_above(floor, lexical, semantic))
                else:
                    hits = lexical[:limit]
        mem = self.mem
        return [(mem[d], float(score)) for d, score in hits]

    def nbytes(self) -> dict[str, int]:
        """Bytes of the numpy arrays, by part (Python objects not counted)."""
        return {"bm25": self.all_bm25.nbytes(), "columns": self.cols.nbytes(),
                "rows": self.mem.nbytes() + self.row_doc.nbytes() + self.text_docs.nbytes(),
                "vectors": sum(ix.nbytes() for ix in self.vectors.values()),
                "old_vectors": sum(ix.nbytes() for ix in self.old_vectors.values())}
