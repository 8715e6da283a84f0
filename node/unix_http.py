"""HTTP/1.1 over the control channel's Unix socket: what the control protocol needs, no more.

One request at a time on a kept-alive connection; a response read line by line (serve streams
NDJSON lines in a chunked body) or whole (a sized body). http.client would do, but importing
it pulls in ``email`` and ``ssl``, about a quarter of what sending a command to serve costs;
this module needs ``socket`` alone. Anything that does not read as HTTP raises ProtocolError,
a ValueError, which the control client reports as a lost connection like any other.
"""
from __future__ import annotations

import contextlib
import io
import os
import socket
from collections.abc import Iterator
from pathlib import Path

CONNECT_TIMEOUT_S = 5.0
# sun_path holds 108 bytes on Linux (104 on macOS), the terminating NUL included.
MAX_SOCKET_PATH = 100
MAX_LINE = 64 << 10  # a status line, a header line or a chunk's size line; a body line may be longer
MAX_HEADERS = 100


class ProtocolError(ValueError):
    """What serve sent does not read as the HTTP/1.1 this client speaks."""


class SocketPathTooLong(OSError):
    """The socket's path does not fit in sun_path and cannot be reached another way here."""


@contextlib.contextmanager
def socket_address(path: Path) -> Iterator[str]:
    """An address for ``path`` that fits in sun_path: the path itself, or on Linux the same file
    reached through an open descriptor of its directory (/proc/self/fd/N/serve.sock)."""
    text = os.fspath(path)
    if len(os.fsencode(text)) <= MAX_SOCKET_PATH:
        yield text
        return
    if not os.path.isdir("/proc/self/fd"):
        raise SocketPathTooLong(text)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


class Response:
    """One response: its status and headers read, its body read on demand."""

    def __init__(self, stream: io.BufferedReader, status: int, headers: dict[str, str]) -> None:
        self._stream = stream
        self.status = status
        self.headers = headers
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self.will_close = headers.get("connection", "").lower() == "close"
        length = headers.get("content-length")
        if not self.chunked and length is not None and not (length.isascii() and length.isdigit()):
            raise ProtocolError(f"Content-Length {length!r} is not a number")
        self._left = None if self.chunked or length is None else int(length)  # None: chunked, or until EOF
        self._chunk_left = 0
        self._done = False
        self._buffer = b""

    def _readline(self) -> bytes:
        line = self._stream.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise ProtocolError("a line of the response is longer than this client reads")
        return line

    def _read_some(self) -> bytes:
        """The next piece of the body; b"" at its end."""
        if self._done:
            return b""
        if not self.chunked:
            want = 65536 if self._left is None else min(self._left, 65536)
            data = self._stream.read(want) if want else b""
            if self._left is not None:
                self._left -= len(data)
                if data == b"" and self._left > 0:
                    raise ProtocolError("the response ended before its Content-Length")
            if not data:
                self._done = True
            return data
        if self._chunk_left == 0:
            size_line = self._readline()
            if not size_line:
                raise ProtocolError("the response ended inside its chunked body")
            size = size_line.split(b";", 1)[0].strip()
            try:
                self._chunk_left = int(size, 16)
            except ValueError:
                raise ProtocolError(f"a chunk size {size[:20]!r} is not a hexadecimal number") from None
            if self._chunk_left == 0:
                while self._readline() not in (b"\r\n", b"\n", b""):  # the trailer, up to its blank line
                    pass
                self._done = True
                return b""
        data = self._stream.read(min(self._chunk_left, 65536))
        if not data:
            raise ProtocolError("the response ended inside a chunk")
        self._chunk_left -= len(data)
        if self._chunk_left == 0 and self._readline() not in (b"\r\n", b"\n"):
            raise ProtocolError("a chunk does not end with a line break")
        return data

    def readline(self) -> bytes:
        """The next line of the body, its line break included; b"" at the end of the body."""
        while b"\n" not in self._buffer:
            data = self._read_some()
            if not data:
                line, self._buffer = self._buffer, b""
                return line
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line + b"\n"

    def read(self) -> bytes:
        """The rest of the body."""
        parts = [self._buffer]
        self._buffer = b""
        while data := self._read_some():
            parts.append(data)
        return b"".join(parts)


class UnixConnection:
    """A kept-alive HTTP/1.1 connection to the Unix socket at ``path``; it connects when first
    asked to send, and again after serve closed it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock: socket.socket | None = None
        self._stream: io.BufferedReader | None = None
        self._spent: list[io.BufferedReader | socket.socket] = []  # a connection serve said it closes

    def connect(self) -> None:
        self._close_spent()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_TIMEOUT_S)
            with socket_address(self.path) as address:
                sock.connect(address)
            sock.settimeout(None)  # a command may run for long (a reindex); serve answers in the end
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self._stream = sock.makefile("rb")

    def close(self) -> None:
        if self._stream is not None and self.sock is not None:
            self._spent += [self._stream, self.sock]
        self._stream = self.sock = None
        self._close_spent()

    def _close_spent(self) -> None:
        for each in self._spent:
            each.close()
        self._spent = []

    def request(self, method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        if self.sock is None:
            self.connect()
        assert self.sock is not None
        lines = [f"{method} {target} HTTP/1.1", "Host: localhost", f"Content-Length: {len(body)}",
                 *(f"{name}: {value}" for name, value in (headers or {}).items())]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)

    def getresponse(self) -> Response:
        if self._stream is None:
            raise ProtocolError("no request was sent")
        stream = self._stream
        status_line = stream.readline(MAX_LINE + 1)
        if not status_line:
            self.close()
            raise ConnectionResetError("serve closed the connection without answering")
        parts = status_line.decode("latin-1").split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"the status line {status_line[:40]!r} is not HTTP/1.1")
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS + 1):
            line = stream.readline(MAX_LINE + 1)
            if line in (b"\r\n", b"\n"):
                break
            if not line or len(line) > MAX_LINE or b":" not in line:
                raise ProtocolError("the response's headers do not read as HTTP/1.1")
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        else:
            raise ProtocolError(f"the response has more than {MAX_HEADERS} headers")
        response = Response(stream, int(parts[1]), headers)
        if response.will_close and self.sock is not None:
            # This response reads to its end; the next request connects again.
            self._spent += [stream, self.sock]
            self.sock = self._stream = None
        return response
