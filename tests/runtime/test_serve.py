"""``serve``'s server says, once it listens, that it cannot chat until the model is loaded, and
says when it can (``server/runtime/serve.py`` ``ChatServer``, ``server/web/app.py``)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import sys
from pathlib import Path

import pytest
from wschat.server.runtime.serve import NOT_READY, ChatServer, frozen_after, uvicorn_config
from wschat.server.settings import Settings
from wschat.server.web.app import build_app

from tests.fakes.scripted import ScriptedEngine
from tests.support import TIMEOUT, HeldLoad, command_until_ready, free_port, run_to_exit, wait_until

# a process of its own imports torch and transformers, and loads the tiny model
START_TIMEOUT = 120.0


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


async def run_server(*args: str, timeout: float) -> tuple[int, str]:
    """``wschat-server ARGS`` as a process of its own, to its exit: its status and stderr."""
    status, _, err = await run_to_exit(
        [sys.executable, "-m", "wschat.server", *args], timeout=timeout
    )
    return status, err


async def test_a_port_in_use_is_said_in_one_line_and_the_model_is_never_loaded(
    tiny_text_dir: Path,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status, err = await run_server(
            "--model", str(tiny_text_dir), "--port", str(port), timeout=START_TIMEOUT
        )
    # the one line is all: no loading began, so nothing else was logged
    assert (status, err.splitlines()) == (
        1,
        [f"wschat-server: cannot listen on 127.0.0.1:{port}: address already in use"],
    )


async def test_loading_the_model_draws_no_progress_bar_into_the_log(
    tiny_text_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    command = [sys.executable, "-m", "wschat.server", "--model", str(tiny_text_dir)]
    command += ["--port", str(port), "--ping-interval-s", "0"]
    async with command_until_ready(command, port, log, dict(os.environ), START_TIMEOUT) as server:
        server.terminate()
        async with asyncio.timeout(TIMEOUT):
            await asyncio.to_thread(server.wait)
    text = log.read_text()
    assert f"Uvicorn running on http://127.0.0.1:{port}" in text  # where, though bound by serve
    assert "loaded " in text  # the loader's own line
    assert "\r" not in text and "Loading weights" not in text, text


def test_what_the_engine_factory_loaded_is_frozen_out_of_the_collector() -> None:
    loaded: list[list[int]] = []

    def make() -> ScriptedEngine:
        loaded.extend([n] for n in range(1000))  # what a load keeps: containers the GC tracks
        return ScriptedEngine()

    try:
        engine = frozen_after(make)()
        assert isinstance(engine, ScriptedEngine) and len(loaded) == 1000
        # frozen: no collection walks them, and no generation holds them
        assert gc.get_freeze_count() >= 1000
        assert not any(o is loaded for o in gc.get_objects())
    finally:
        gc.unfreeze()  # this test process goes on collecting as before
