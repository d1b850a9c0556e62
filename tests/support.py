"""Test helpers: a real uvicorn server on an ephemeral loopback port, and a raw msgpack peer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import msgpack
import uvicorn
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.client import ClientProtocol
from websockets.extensions.permessage_deflate import ClientPerMessageDeflateFactory
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.typing import Subprotocol
from websockets.uri import parse_uri
from wschat.protocol import Stats, decode_server_frame
from wschat.server.engine import Engine, Finished, Generation, TokenPiece
from wschat.server.runtime.redaction import install_log_filters
from wschat.server.runtime.serve import uvicorn_config
from wschat.server.settings import Settings
from wschat.server.web.app import EngineFactory, build_app

TIMEOUT = 30.0
SUBPROTOCOL = Subprotocol("wschat.v1")  # the protocol a test client asks for
ROOT = Path(__file__).resolve().parents[1]


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
        ws = await websockets.connect(url, subprotocols=[SUBPROTOCOL], **kwargs)
    try:
        peer = RawPeer(ws)
        ready = await peer.recv()
        assert ready["type"] == "ready"
        yield peer, ready
    finally:
        async with asyncio.timeout(TIMEOUT):
            await ws.close()


class ZombiePeer:
    """A WebSocket client over a plain socket that can stop reading for good: nothing reads
    behind its back (a websockets client keeps draining the socket into its own queue), so what
    the server sends piles up in the socket buffers, then in the server."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ws: ClientProtocol
    ) -> None:
        self.reader, self.writer, self.ws = reader, writer, ws
        self._events: list[Frame | Response] = []
        self.ready: dict[str, Any] = {}  # the server's ``ready`` (zombie_peer)

    async def send(self, frame: dict[str, Any]) -> None:
        self.ws.send_binary(msgpack.packb(frame, use_bin_type=True))
        await self.flush()

    async def ping(self, payload: bytes) -> None:
        self.ws.send_ping(payload)
        await self.flush()

    async def flush(self) -> None:
        """Write what the protocol has queued (frames, a close) to the socket."""
        self.writer.write(b"".join(self.ws.data_to_send()))
        async with asyncio.timeout(TIMEOUT):
            await self.writer.drain()

    async def event(self) -> Frame | Response:
        async with asyncio.timeout(TIMEOUT):
            while not self._events:
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionError("the server closed the connection")
                self.ws.receive_data(data)
                received = self.ws.events_received()  # a client receives no Request
                self._events += [e for e in received if isinstance(e, Frame | Response)]
        return self._events.pop(0)

    async def recv_until(self, kind: str) -> dict[str, Any]:
        """Data frames up to the first of type ``kind``; returns that one."""
        while True:
            event = await self.event()
            if isinstance(event, Frame) and event.opcode is Opcode.BINARY:
                frame: dict[str, Any] = msgpack.unpackb(event.data, raw=False)
                if frame["type"] == kind:
                    return frame

    async def wait_all_read(self) -> None:
        """Until the server has read everything this peer sent."""
        mine = self.writer.get_extra_info("sockname")
        server = self.writer.get_extra_info("peername")
        await wait_until(lambda: tcp_queues(mine, server)[0] + tcp_queues(server, mine)[1] == 0)

    async def wait_closed_by_server(self, timeout: float = TIMEOUT) -> int | None:
        """Read what is left until the server drops the connection (fails after ``timeout``);
        the code of its close frame, None when it reset the connection without one."""
        try:
            async with asyncio.timeout(timeout):
                while data := await self.reader.read(1 << 20):
                    self.ws.receive_data(data)
        except ConnectionResetError:
            pass
        return self.ws.close_rcvd.code if self.ws.close_rcvd else None


@contextlib.asynccontextmanager
async def zombie_peer(url: str, *, deflate: bool = False) -> AsyncIterator[ZombiePeer]:
    """A ``ZombiePeer`` past ``ready``, with a small receive buffer; ``deflate`` offers
    permessage-deflate as browsers do. Always closes its socket."""
    ws = ClientProtocol(
        parse_uri(url),
        subprotocols=[SUBPROTOCOL],
        extensions=[ClientPerMessageDeflateFactory()] if deflate else None,
    )
    async with asyncio.timeout(TIMEOUT):
        reader, writer = await asyncio.open_connection(sock=small_buffer_socket(url))
    try:
        peer = ZombiePeer(reader, writer, ws)
        ws.send_request(ws.connect())
        await peer.flush()
        response = await peer.event()
        assert isinstance(response, Response) and response.status_code == 101, response
        peer.ready = await peer.recv_until("ready")
        yield peer
    finally:
        writer.transport.abort()


@contextlib.asynccontextmanager
async def stats_socket(url: str, **kwargs: Any) -> AsyncIterator[ClientConnection]:
    """A ``/v1/stats`` socket of the server whose chat ``url`` is given."""
    async with asyncio.timeout(TIMEOUT):
        ws = await websockets.connect(url.replace("/v1/chat", "/v1/stats"), **kwargs)
    try:
        yield ws
    finally:
        async with asyncio.timeout(TIMEOUT):
            await ws.close()


async def next_stats(ws: ClientConnection) -> Stats:
    async with asyncio.timeout(TIMEOUT):
        frame = decode_server_frame(await ws.recv())  # type: ignore[arg-type]
    assert isinstance(frame, Stats)
    return frame


async def closed_before_ready(url: str, **kwargs: Any) -> tuple[int, str]:
    """The close code and reason of a handshake that was accepted and closed at once."""
    async with asyncio.timeout(TIMEOUT):
        ws = await websockets.connect(url, subprotocols=[SUBPROTOCOL], **kwargs)
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


def small_buffer_socket(url: str) -> socket.socket:
    """A client socket with a small receive buffer, so a stall backs up to the server soon."""
    host, port = url.removeprefix("ws://").split("/")[0].split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    return sock


def tcp_queues(local: tuple[str, int], remote: tuple[str, int]) -> tuple[int, int]:
    """(bytes queued to send, bytes received and not yet read) of the IPv4 TCP socket
    ``local`` -> ``remote`` on this host, from /proc/net/tcp; (0, 0) once it is gone."""

    def key(address: tuple[str, int]) -> str:
        host = socket.inet_aton(address[0])[::-1].hex().upper()
        return f"{host}:{address[1]:04X}"

    wanted = (key(local), key(remote))
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if (fields[1], fields[2]) == wanted:
            tx, rx = fields[4].split(":")
            return int(tx, 16), int(rx, 16)
    return 0, 0


def modules_loaded_by(code: str) -> list[str]:
    """The modules that running ``code`` in a fresh, isolated interpreter loads, beyond what
    the interpreter itself starts with."""
    probe = (
        "import json, sys\nbefore = set(sys.modules)\n"
        f"{code}\nprint(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    loaded: list[str] = json.loads(result.stdout)
    return loaded


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_ready(
    proc: subprocess.Popen[bytes],
    port: int,
    log: Path,
    timeout: float = TIMEOUT,
    host: str = "127.0.0.1",
    path: str = "/readyz",
) -> None:
    """Until a server process answers ``path`` 200 (``/healthz``: it listens, its model may
    still load); fails with its log if it exits."""
    async with asyncio.timeout(timeout), httpx.AsyncClient(timeout=5) as http:
        while True:  # another process: nothing to await but its answer
            assert proc.poll() is None, log.read_text()
            try:
                if (await http.get(f"http://{host}:{port}{path}")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def server_process(
    log: Path,
    *options: str,
    preexec_fn: Callable[[], None] | None = None,
    env: dict[str, str] | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
) -> AsyncIterator[tuple[subprocess.Popen[bytes], str]]:
    """The real ``serve`` on the scripted engine in a process of its own
    (``tests/hardening/scripted_server.py``), with ``wschat-server`` options and ``env`` added
    to the environment, on ``host`` and ``port`` (default: a free one); yields the process and
    ``ws://.../v1/chat`` once it is ready, and kills it by its pid if it is still running."""
    port = port or free_port()
    module = "tests.hardening.scripted_server"
    command = [sys.executable, "-m", module, str(port), "--host", host, *options]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    async with command_until_ready(
        command, port, log, env, TIMEOUT, host=host, cwd=ROOT, preexec_fn=preexec_fn
    ) as proc:
        yield proc, f"ws://{host}:{port}/v1/chat"


@contextlib.asynccontextmanager
async def command_until_ready(
    command: list[str],
    port: int,
    log: Path,
    env: dict[str, str],
    start_timeout: float,
    *,
    host: str = "127.0.0.1",
    **popen: Any,
) -> AsyncIterator[subprocess.Popen[bytes]]:
    """A server process (``command``, its output in ``log``) once it answers ``/readyz`` on
    ``host``:``port``; killed by its pid if it still runs at the end. ``popen``: more ``Popen``
    options."""
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=sink, env=env, **popen)
    try:
        await wait_ready(process, port, log, start_timeout, host)
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
    command = console_script("wschat", "wschat.client", env.get("PATH"))
    return await run_to_exit([*command, "ask", *args], env=env, timeout=timeout)


async def run_to_exit(
    command: list[str], *, timeout: float, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """``command`` as a subprocess, to its exit (killed past ``timeout``): status, out, err."""
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
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
