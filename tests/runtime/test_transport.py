"""The transport under the app: what every accepted connection gets."""

from __future__ import annotations

import asyncio
import socket

import uvicorn
import websockets
from wschat.server.runtime.serve import uvicorn_config
from wschat.server.settings import Settings
from wschat.server.web.app import build_app

from tests.fakes.scripted import ScriptedEngine
from tests.support import SUBPROTOCOL, TIMEOUT


async def test_a_connection_on_a_plain_socket_sends_each_frame_without_delay() -> None:
    # a listening socket made without IPPROTO_TCP, as tests and --fd users hand to uvicorn:
    # asyncio leaves Nagle's algorithm on for what it accepts
    settings = Settings(ping_interval_s=0.0, log_level="warning")
    server = uvicorn.Server(uvicorn_config(settings, build_app(settings, ScriptedEngine())))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(TIMEOUT):
            while not server.started:
                await asyncio.sleep(0.01)
            url = f"ws://127.0.0.1:{port}/v1/chat"
            async with websockets.connect(url, subprotocols=[SUBPROTOCOL]) as ws:
                await ws.recv()  # ready: the connection is accepted and upgraded
                (protocol,) = server.server_state.connections
                accepted = protocol.transport.get_extra_info("socket")
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        server.should_exit = True
        async with asyncio.timeout(TIMEOUT):
            await task
        sock.close()
