"""The context window of a session over its pyramid, within a budget of characters.

The window shows the newest raw turns, then level-1 summaries of older spans, then level-2
summaries of the oldest, and covers as much of the session as the budget allows:

1. **Coarsest cover.** The session at its lowest resolution (``Pyramid.cover``): level-2
   chunks, the level-1 chunks outside them, the turns outside any chunk, oldest first. A chunk
   without a summary yet (a turn's text has not arrived) is replaced by its children.
2. **Fit.** Items are kept newest first while they fit; the first that does not fit ends the
   window, so it is always one unbroken stretch reaching the newest turn.
3. **Refine, newest first.** Walking from the newest item back, a chunk is replaced by its
   children (a level-2 chunk by its level-1 summaries, a level-1 chunk by its turns) when the
   whole window still fits; the first replacement that does not fit stops the walk. So
   resolution only ever falls with age, and a budget that holds every turn shows every turn.
4. **Detail at the newest end** (before 3, when the session is too long for 3 to refine
   anything): the newest chunk, if it is level 2, is replaced by its level-1 children, and then,
   if no raw turn follows the newest chunk, that chunk by its turns, each time dropping the
   oldest items to make room, when all its children fit. So a long session's window
   still ends with raw turns, then level-1 summaries, then level-2 summaries of older spans.

The text is the items oldest first, one per line (``role: text`` for a turn, ``[summary of
turns A-B] TEXT`` for a chunk), joined by newlines; its length in code points, separators
counted, never exceeds the budget.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .pyramid import Pyramid, Span
from .record import Turn

__all__ = ["Window", "WindowItem", "build_window", "summary_line", "turn_line"]

Item = Turn | Span


@dataclass(frozen=True, slots=True)
class WindowItem:
    kind: str  # "turn" | "chunk"
    id: str
    level: int  # 0 for a turn
    from_seq: int
    to_seq: int
    line: str


@dataclass(frozen=True)
class Window:
    text: str
    items: list[WindowItem]  # oldest first, as in the text
    budget: int

    @property
    def chars(self) -> int:
        return len(self.text)


def turn_line(t: Turn, text: str) -> str:
    return f"{t.role}: {text}"


def summary_line(span: Span, summary: str) -> str:
    return f"[summary of turns {span.from_seq}-{span.to_seq}] {summary}"


def build_window(p: Pyramid, turn_text: Callable[[Turn], str | None], summary: Callable[[Span], str | None],
                 budget: int) -> Window:
    """``turn_text``/``summary``: a turn's text, a chunk's shown summary (None: not held yet)."""
    lines: dict[str, str | None] = {}

    def line(x: Item) -> str | None:
        if x.id not in lines:
            if isinstance(x, Turn):
                text = turn_text(x)
                lines[x.id] = None if text is None else turn_line(x, text)
            else:
                text = summary(x)
                lines[x.id] = None if text is None else summary_line(x, text)
        return lines[x.id]

    def children(c: Span) -> list[Item]:
        if c.level == 1:
            return [p.turn_by_id[i] for i in c.children if i in p.turn_by_id]
        return [p.by_id[i] for i in c.children if i in p.by_id]

    def shown(xs: list[Item]) -> list[Item]:
        """Items with a line; a chunk without one stands as its children."""
        out: list[Item] = []
        for x in xs:
            if line(x) is not None:
                out.append(x)
            elif isinstance(x, Span):
                out.extend(shown(children(x)))
        return out

    def cost(xs: list[Item]) -> int:
        return sum(len(line(x) or "") for x in xs) + max(len(xs) - 1, 0)

    cover = shown(p.cover())
    items: list[Item] = []
    used = 0
    for x in reversed(cover):
        extra = len(line(x) or "") + (1 if items else 0)
        if used + extra > budget:
            break
        items.append(x)
        used += extra
    items.reverse()

    def refine_newest(items: list[Item]) -> list[Item]:
        """Step 4 for the newest chunk: its children (the newest that fit), then older items."""
        newest = next(((k, x) for k, x in reversed(list(enumerate(items))) if isinstance(x, Span)), None)
        if newest is None:
            return items
        j, chunk = newest
        finer = shown(children(chunk))
        new = list(items[j + 1:])
        total = cost(new)
        taken = 0
        for y in reversed(finer):
            extra = len(line(y) or "") + (1 if new else 0)
            if total + extra > budget:
                break
            new.insert(0, y)
            total += extra
            taken += 1
        if taken < len(finer):
            return items  # its children do not all fit: the chunk's summary says more
        for y in reversed(items[:j]):
            extra = len(line(y) or "") + 1
            if total + extra > budget:
                break
            new.insert(0, y)
            total += extra
        return new

    def newest_chunk(items: list[Item]) -> tuple[Span | None, bool]:
        """The newest chunk of the window, and whether a raw turn follows it."""
        for k in range(len(items) - 1, -1, -1):
            item = items[k]
            if isinstance(item, Span):
                return item, k < len(items) - 1
        return None, True

    chunk, _ = newest_chunk(items)
    if chunk is not None and chunk.level == 2:
        items = refine_newest(items)
    chunk, raw_after = newest_chunk(items)
    if chunk is not None and not raw_after:
        items = refine_newest(items)
    used = cost(items)
    i = len(items) - 1
    while i >= 0:
        x = items[i]
        if isinstance(x, Turn):
            i -= 1
            continue
        finer = shown(children(x))
        after = used - len(line(x) or "") + cost(finer)
        if not finer or after > budget:
            break
        items[i:i + 1] = finer
        used = after
        i += len(finer) - 1  # the newest of the children is examined next
    out = []
    for x in items:
        text = line(x) or ""
        if isinstance(x, Turn):
            out.append(WindowItem("turn", x.id, 0, x.seq, x.seq, text))
        else:
            out.append(WindowItem("chunk", x.id, x.level, x.from_seq, x.to_seq, text))
    text = "\n".join(w.line for w in out)
    assert len(text) == used <= budget  # the invariant the budget promises
    return Window(text, out, budget)
