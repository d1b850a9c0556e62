"""Test helpers: a real uvicorn server on an ephemeral loopback port, and a raw msgpack peer."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import uvicorn
import websockets
from websockets.asyncio.client import ClientConnection
from wschat.server.app import EngineFactory, build_app
from wschat.server.engine import Engine, Finished, Generation, TokenPiece
from wschat.server.serve import install_log_filters, uvicorn_config
from wschat.server.settings import Settings

TIMEOUT = 30.0


@contextlib.asynccontextmanager
async def running_server(
    engine: Engine | EngineFactory,
    settings: Settings | None = None,
    *,
    port: int = 0,
    **overrides: Any,
) -> AsyncIterator[str]:
    """Serve ``engine`` on 127.0.0.1:<free port> (or ``port``, to restart a server where it was);
    yields ``ws://.../v1/chat``; always stops. A factory is run in a thread, as the CLI does."""
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


class HeldLoad:
    """An engine factory that, like a model loading, does not return until ``release()``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._released = threading.Event()  # set by the test (or on leaving ``loading_server``)

    def __call__(self) -> Engine:
        self._released.wait(TIMEOUT)  # bounded: a failed test cannot leave the thread behind
        return self.engine

    def release(self) -> None:
        self._released.set()


@contextlib.asynccontextmanager
async def loading_server(engine: Engine, **overrides: Any) -> AsyncIterator[tuple[str, HeldLoad]]:
    """A real server whose model loads until the test calls ``release()`` on the ``HeldLoad``."""
    load = HeldLoad(engine)
    try:
        async with running_server(load, **overrides) as url:
            yield url, load
    finally:
        load.release()


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


@contextlib.asynccontextmanager
async def server_process(
    command: list[str], port: int, log: Path, env: dict[str, str], start_timeout: float
) -> AsyncIterator[subprocess.Popen[bytes]]:
    """A server process (``command``, its output in ``log``) once it answers ``/readyz`` on
    ``port``; killed by its pid if it still runs at the end."""
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=sink, env=env)
    try:
        await wait_ready(process, port, log, start_timeout)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(TIMEOUT)


def console_script(script: str, module: str, path: str | None = None) -> list[str]:
    """The console script ``script`` found on ``path`` (default: $PATH), as the README runs it;
    ``python -m module`` where it is not installed."""
    found = shutil.which(script, path=path)
    return [found] if found else [sys.executable, "-m", module]


async def run_ask(*args: str, env: dict[str, str], timeout: float) -> tuple[int, str, str]:
    """``wschat ask ARGS`` (the script on ``env``'s PATH) as a subprocess: status, out, err."""
    process = await asyncio.create_subprocess_exec(
        *console_script("wschat", "wschat.client", env.get("PATH")),
        "ask",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        async with asyncio.timeout(timeout):
            out, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()
