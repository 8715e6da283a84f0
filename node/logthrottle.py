"""Repeated log records folded into one line per interval, with a count.

Anything a stranger can make happen once per connection or per packet (a refused or timed-out
connection, a malformed request, asyncio's "socket.accept() out of system resource") must not
write a line per occurrence: a flood of them once wrote 190 MB of log in two minutes. The
``RepeatFilter`` on serve's log handler lets the first record of a key through, counts the
ones that follow within ``interval_s``, and puts the count on the next line of that key
(``repeated=N``: N records like it were not written since the previous one). ``flush()``
gives the lines owed for keys whose interval ended, so the count of a burst that stopped is
written too (serve calls it every interval and as it stops).

Which records are folded: every record of a library's logger (asyncio, aiohttp, ...: their
records repeat per event and never come from an operator's action), and memmesh records that
carry a ``throttle`` key (``extra={"throttle": "connection.refused sync"}``), with
``throttle_burst`` records of a key written per interval before folding (1 unless given: the
access log lets a few requests of each kind through, so honest traffic keeps its lines while
a flood of them folds). memmesh's other records are written as they come: they are paced by
serve itself (a sync round, a command), and an operator acting twice should see two lines.
"""
from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable

__all__ = ["OWN_LOGGERS", "REPEAT_INTERVAL_S", "RepeatFilter"]

REPEAT_INTERVAL_S = 10.0
MAX_KEYS = 1024  # keys are code locations (message templates, event names): a few dozen in practice
OWN_LOGGERS = ("memmesh",)  # every logger of the package is named under memmesh.
_DIRECTIVE = re.compile(r"%(?:\([^)]*\))?[-#0 +]*\d*(?:\.\d+)?[sdrifxXeEgGc%]")


class _Slot:
    __slots__ = ("since", "count", "last", "written")

    def __init__(self, since: float) -> None:
        self.since = since
        self.count = 0
        self.written = 1
        self.last: logging.LogRecord | None = None


class RepeatFilter(logging.Filter):
    def __init__(self, interval_s: float = REPEAT_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.clock = clock
        self._slots: dict[object, _Slot] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(record: logging.LogRecord) -> object | None:
        """The key a record is folded under, None when it is always written."""
        explicit = getattr(record, "throttle", None)
        if explicit is not None:
            return ("key", explicit)
        if record.name.split(".", 1)[0] in OWN_LOGGERS:
            return None
        # The template, not the formatted text: what varies per event (addresses, fds) is in the args.
        # Its first line only: asyncio's exception handler folds varying details into later lines.
        template = record.msg if isinstance(record.msg, str) else type(record.msg).__name__
        if not _DIRECTIVE.sub("", template).strip():  # "%s": the text is all in the args (py.warnings)
            with contextlib.suppress(Exception):  # a bad format string keeps its template
                template = record.getMessage()
        return (record.name, record.levelno, template.split("\n", 1)[0][:200])

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "repeat_summary", False):
            return True
        key = self.key(record)
        if key is None:
            return True
        now = self.clock()
        with self._lock:
            slot = self._slots.get(key)
            if slot is None or now - slot.since >= self.interval_s:
                if slot is not None and slot.count:
                    record.repeated = slot.count
                if slot is None and len(self._slots) >= MAX_KEYS:
                    self._drop_oldest()
                self._slots[key] = _Slot(now)
                return True
            if slot.written < _burst(record) and not slot.count:
                slot.written += 1
                return True
            slot.count += 1
            slot.last = record
            return False

    def flush(self, everything: bool = False) -> list[logging.LogRecord]:
        """A line for each key whose interval ended (every key with ``everything``) with records
        not written: the last of them, with ``repeated`` = how many were not written."""
        now = self.clock()
        out: list[logging.LogRecord] = []
        with self._lock:
            for key, slot in list(self._slots.items()):
                if not (everything or now - slot.since >= self.interval_s):
                    continue
                if slot.count and slot.last is not None:
                    line = logging.makeLogRecord(slot.last.__dict__)
                    line.created = time.time()  # written now: the log stays in time order
                    line.repeated = slot.count
                    line.repeat_summary = True
                    out.append(line)
                del self._slots[key]
        return out

    def _drop_oldest(self) -> None:
        for key in sorted(self._slots, key=lambda k: self._slots[k].since)[: MAX_KEYS // 4]:
            del self._slots[key]


def _burst(record: logging.LogRecord) -> int:
    burst = getattr(record, "throttle_burst", 1)
    return burst if isinstance(burst, int) and burst > 1 else 1
