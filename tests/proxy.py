"""``CuttableProxy``: a loopback TCP relay in front of a server whose live connections a test can
cut, like a dropped network, while the server and the relay's listener stay up. It counts the
connections it relays and keeps the request line each opened with, so a test can tell how often
a client came back and what it asked for."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from tests.support import TIMEOUT


class CuttableProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.accepted = 0  # connections relayed so far
        self._heads: list[bytearray] = []  # what each client sent first, to its first line at least
        self._writers: set[asyncio.StreamWriter] = set()
        self._pumps: set[asyncio.Task[None]] = set()

    @property
    def requests(self) -> list[str]:
        """The request line each relayed connection opened with (a WebSocket handshake's)."""
        return [head.partition(b"\r\n")[0].decode("latin-1") for head in self._heads]

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        head: bytearray | None = None,
    ) -> None:
        try:
            while data := await reader.read(65536):
                if head is not None and b"\n" not in head:
                    head += data
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        async with asyncio.timeout(TIMEOUT):
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers |= {writer, up_writer}
        self._heads.append(head := bytearray())
        for task in (self._pump(reader, up_writer, head), self._pump(up_reader, writer)):
            pump = asyncio.create_task(task)
            self._pumps.add(pump)
            pump.add_done_callback(self._pumps.discard)

    def cut(self) -> None:
        """Drop every connection now open (new ones are relayed as before)."""
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()


@contextlib.asynccontextmanager
async def cuttable_proxy(upstream_port: int) -> AsyncIterator[CuttableProxy]:
    proxy = CuttableProxy(upstream_port)
    server = await asyncio.start_server(proxy._accept, "127.0.0.1", 0)
    proxy.port = server.sockets[0].getsockname()[1]
    try:
        yield proxy
    finally:
        server.close()
        proxy.cut()
        for pump in list(proxy._pumps):
            pump.cancel()
        async with asyncio.timeout(TIMEOUT):
            await asyncio.gather(*proxy._pumps, return_exceptions=True)
            await server.wait_closed()
