"""``serve``'s server says, once it listens, that it cannot chat until the model is loaded, and
says when it can (``server/runtime/serve.py`` ``ChatServer``, ``server/web/app.py``)."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest
from wschat.server.runtime.serve import NOT_READY, ChatServer, uvicorn_config
from wschat.server.settings import Settings
from wschat.server.web.app import build_app

from tests.fakes.scripted import ScriptedEngine
from tests.support import TIMEOUT, HeldLoad, wait_until


async def test_listening_before_the_model_is_loaded_logs_not_ready_then_ready(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="wschat")
    load = HeldLoad(ScriptedEngine())
    settings = Settings(ping_interval_s=0.0, log_level="warning")
    app = build_app(settings, load)
    server = ChatServer(
        uvicorn_config(settings, app), app.state.hub, app.state.stats_feed, grace_s=0.1
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_until(lambda: server.started or task.done())
        messages = [r.getMessage() for r in caplog.records if r.name.startswith("wschat")]
        assert NOT_READY in messages and not any(m.startswith("ready:") for m in messages)
        assert (
            NOT_READY
            == "not ready yet: loading the model (chats are closed with 1013 until it is loaded)"
        )
        load.release()
        await wait_until(lambda: any(r.getMessage().startswith("ready:") for r in caplog.records))
    finally:
        load.release()
        server.should_exit = True
        async with asyncio.timeout(TIMEOUT):
            await task
        sock.close()
    ready = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ready:")]
    assert len(ready) == 1 and ready[0].startswith("ready: accepting chats (the model took ")
