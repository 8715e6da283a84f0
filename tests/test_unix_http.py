"""The control channel's HTTP/1.1 client (node/unix_http.py) against a scripted Unix socket server."""
from __future__ import annotations

import socket
import threading

import pytest

from memmesh.node.unix_http import ProtocolError, UnixConnection

CHUNKED = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5\r\n{\"a\":\r\n7\r\n 1}\n{\"b\r\n6;ext=1\r\n\": 2}\n\r\n0\r\n\r\n")
SIZED = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 9\r\nX-Any: y\r\n\r\n{\"c\": 3}\n"
CLOSING = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nlast\n"


def _serve(path, answers):
    """Answer each connection's requests with the next scripted answers, in order."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    requests = []

    def run():
        for per_connection in answers:
            conn, _ = server.accept()
            with conn:
                for answer in per_connection:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += conn.recv(4096)
                    head, _, body = data.partition(b"\r\n\r\n")
                    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                      if line.lower().startswith(b"content-length")))
                    while len(body) < length:
                        body += conn.recv(4096)
                    requests.append((head.split(b"\r\n")[0], body))
                    conn.sendall(answer)
        server.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, requests


def test_lines_across_chunks_a_sized_body_and_a_closed_connection(tmp_path):
    thread, requests = _serve(tmp_path / "s.sock", [[CHUNKED, SIZED, CLOSING], [SIZED]])
    conn = UnixConnection(tmp_path / "s.sock")
    conn.request("POST", "/run", b'{"name": "x"}', {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.chunked
    assert [resp.readline(), resp.readline(), resp.readline()] == [b'{"a": 1}\n', b'{"b": 2}\n', b""]
    conn.request("GET", "/status")  # the same connection carries the next request
    resp = conn.getresponse()
    assert (resp.status, resp.headers["x-any"], resp.read()) == (400, "y", b'{"c": 3}\n')
    conn.request("GET", "/status")
    resp = conn.getresponse()
    assert resp.will_close and resp.read() == b"last\n"
    conn.request("GET", "/status")  # serve closed that one: a new connection
    assert conn.getresponse().read() == b'{"c": 3}\n'
    conn.close()
    thread.join(5)
    assert requests[0] == (b"POST /run HTTP/1.1", b'{"name": "x"}') and len(requests) == 4


def test_what_is_not_http_is_a_protocol_error(tmp_path):
    thread, _ = _serve(tmp_path / "s.sock", [[b"SSH-2.0-OpenSSH\r\n\r\n"]])
    conn = UnixConnection(tmp_path / "s.sock")
    conn.request("GET", "/status")
    with pytest.raises(ProtocolError, match="not HTTP/1.1"):
        conn.getresponse()
    conn.close()
    thread.join(5)
