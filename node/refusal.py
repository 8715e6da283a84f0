"""What a refused command says, the same on every transport: its error types and one bounded line.

The CLI prints it, serve's control channel, the HTTP API, MCP and chat answer with it; it sits
below all of them (it needs only the error types) so none climbs to another to reach it.
"""
from __future__ import annotations

import re

from memmesh.auth.errors import MemmeshError


class ParamsError(MemmeshError):
    """Parameters a command refuses; nothing was changed. The message says what to fix."""


def failure(exc: BaseException) -> tuple[str, int] | None:
    """The one line and the exit code that a failed command gives, or None for an exception
    that is not a refusal (a bug: it propagates). serve answers with the same mapping."""
    if isinstance(exc, MemmeshError):
        return one_line(str(exc)), 1
    if isinstance(exc, OSError):  # the file system refused: say which file and why
        where = f" ({exc.filename})" if exc.filename else ""
        return one_line(f"{exc.strerror or exc}{where}"), 1
    return None


MAX_QUOTED = 80  # a value a message quotes is cut to this many characters: enough to recognise it
MAX_LINE = 1000  # a refusal is one line someone reads, whatever it quotes
_QUOTED = re.compile(rf"'[^'\n]{{{MAX_QUOTED},}}'|\"[^\"\n]{{{MAX_QUOTED},}}\"")


def one_line(text: str) -> str:
    """A refusal, bounded, the same on every transport: a quoted value (a 100,000 character
    bank name, a 5,000 digit number) is cut, and a control character a message quotes from its
    input (CR, ESC) is escaped, so it can neither rewrite the line nor drive the reader's
    terminal. Line breaks stay: a refusal of several parts (sync: one line per peer) keeps
    them; every value quoted from input is a repr, whose line breaks are escaped already."""
    text = _QUOTED.sub(lambda m: m.group(0)[:MAX_QUOTED - 4] + "..." + m.group(0)[0], text)
    return "\n".join(_printable(line) for line in text.split("\n"))


def _printable(line: str) -> str:
    line = "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in line)
    return line if len(line) <= MAX_LINE else line[:MAX_LINE - 3] + "..."
