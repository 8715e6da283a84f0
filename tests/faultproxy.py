"""A small fault-injecting TCP proxy for multi-process sync tests (loopback only).

Each proxy forwards 127.0.0.1:<port> to a node's real port, in a thread with its own event
loop. ``cut()`` drops every open connection and refuses new ones (the link is down);
``heal()`` brings it back. Used to partition nodes without killing them.
"""
from __future__ import annotations

import asyncio
import threading


class Proxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._cut = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def start(self) -> int:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        self.port = fut.result(5)
        return self.port

    async def _start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    if self._cut:
                        break
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    def cut(self) -> None:
        def do() -> None:
            self._cut = True
            for w in list(self._writers):
                w.close()
        self._loop.call_soon_threadsafe(do)

    def heal(self) -> None:
        self._loop.call_soon_threadsafe(setattr, self, "_cut", False)

    def retarget(self, port: int) -> None:
        """A restarted node listens on a new port: forward there from now on."""
        self._loop.call_soon_threadsafe(setattr, self, "target_port", port)

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                w.close()
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
