"""Test helpers: a real uvicorn server on an ephemeral loopback port, and a raw msgpack peer."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import uvicorn
import websockets
from websockets.asyncio.client import ClientConnection
from wschat.server.app import build_app
from wschat.server.engine import Engine, Finished, Generation, TokenPiece
from wschat.server.serve import install_log_filters, uvicorn_config
from wschat.server.settings import Settings

TIMEOUT = 30.0


@contextlib.asynccontextmanager
async def running_server(
    engine: Engine, settings: Settings | None = None, *, port: int = 0, **overrides: Any
) -> AsyncIterator[str]:
    """Serve ``engine`` on 127.0.0.1:<free port> (or ``port``, to restart a server where it was);
    yields ``ws://.../v1/chat``; always stops."""
    settings = settings or Settings(**{"ping_interval_s": 0.0, "log_level": "warning", **overrides})
    app = build_app(settings, engine)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(settings, app))
    install_log_filters()
    server.config.port = port
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(TIMEOUT):
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
        yield f"ws://127.0.0.1:{port}/v1/chat"
    finally:
        server.should_exit = True
        async with asyncio.timeout(TIMEOUT):
            await task
        sock.close()


def http_base(url: str) -> str:
    """``http://host:port`` of a ``ws://host:port/v1/chat`` URL."""
    return url.replace("ws://", "http://").removesuffix("/v1/chat")


class RawPeer:
    """A client written from PROTOCOL.md alone: plain websockets + msgpack."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    async def send(self, frame: dict[str, Any]) -> None:
        await self.ws.send(msgpack.packb(frame, use_bin_type=True))

    async def recv(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            data = await self.ws.recv()
        assert isinstance(data, bytes), f"server sent a text frame: {data!r}"
        return msgpack.unpackb(data, raw=False)  # type: ignore[no-any-return]

    async def recv_until(self, kind: str, timeout: float = TIMEOUT) -> list[dict[str, Any]]:
        """Frames up to and including the first of type ``kind``."""
        frames = []
        async with asyncio.timeout(timeout):
            while True:
                frame = await self.recv()
                frames.append(frame)
                if frame["type"] == kind:
                    return frames


@contextlib.asynccontextmanager
async def raw_peer(url: str, **kwargs: Any) -> AsyncIterator[tuple[RawPeer, dict[str, Any]]]:
    async with asyncio.timeout(TIMEOUT):
        ws = await websockets.connect(url, subprotocols=["wschat.v1"], **kwargs)
    try:
        peer = RawPeer(ws)
        ready = await peer.recv()
        assert ready["type"] == "ready"
        yield peer, ready
    finally:
        async with asyncio.timeout(TIMEOUT):
            await ws.close()


async def closed_before_ready(url: str, **kwargs: Any) -> tuple[int, str]:
    """The close code and reason of a handshake that was accepted and closed at once."""
    async with asyncio.timeout(TIMEOUT):
        ws = await websockets.connect(url, subprotocols=["wschat.v1"], **kwargs)
        try:
            first = await ws.recv()
        except websockets.ConnectionClosed as closed:
            assert closed.rcvd is not None
            return closed.rcvd.code, closed.rcvd.reason
        await ws.close()
    raise AssertionError(f"the connection was served: {first!r}")


def generation_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("wschat-generate")]


async def wait_until(predicate: Any, timeout: float = TIMEOUT, interval: float = 0.01) -> None:
    """Poll a condition that has no awaitable (thread exits); fails loudly on timeout."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(interval)


async def collect(generation: Generation) -> tuple[str, Finished]:
    """A generation's whole text and its ``Finished``, read from the engine directly."""
    texts: list[str] = []
    async with asyncio.timeout(TIMEOUT):
        async for item in generation.items():
            if isinstance(item, TokenPiece):
                texts.append(item.text)
            else:
                return "".join(texts), item
    raise AssertionError("a generation ended without Finished")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_ready(
    proc: subprocess.Popen[bytes], port: int, log: Path, timeout: float = TIMEOUT
) -> None:
    """Until a server process answers ``/readyz`` 200; fails with its log if it exits."""
    async with asyncio.timeout(timeout), httpx.AsyncClient(timeout=5) as http:
        while True:  # another process: nothing to await but its /readyz
            assert proc.poll() is None, log.read_text()
            try:
                if (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)
