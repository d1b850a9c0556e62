"""The README's commands on the embedded Gemma 3 270M: ``wschat-server`` (converting the GGUF on
first use) and ``wschat ask``; then SIGTERM, and the server exits 0."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from tests.images.samples import png
from tests.support import command_until_ready, console_script, free_port, run_ask

pytestmark = pytest.mark.real_model

START_TIMEOUT = 600.0  # the first start converts the GGUF (about a minute on 2 cores)
ASK_TIMEOUT = 120.0
CUT_NOTICE = "[reply cut at the 3-token limit: ask for up to 1024 with --max-new-tokens]\n"


async def ask(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    return await run_ask(*args, env=env, timeout=ASK_TIMEOUT)


async def test_readme_commands_serve_the_embedded_model_and_stop_cleanly(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WSCHAT_")}
    env |= {"HF_HUB_OFFLINE": "1", "WSCHAT_URL": f"ws://127.0.0.1:{port}/v1/chat"}
    command = [*console_script("wschat-server", "wschat.server"), "--port", str(port)]
    async with command_until_ready(command, port, log, env, START_TIMEOUT) as server:
        status, out, err = await ask("What is the capital of France?", env=env)
        assert (status, err) == (0, "")  # 0: the reply ended on its own, before the length limit
        assert "Paris" in out, out
        status, out, err = await ask("--max-new-tokens", "3", "Tell me about Paris.", env=env)
        assert (status, err) == (6, CUT_NOTICE)  # 6: printed, but cut at the limit, and said so
        assert out.strip(), "the reply was empty"
        image = tmp_path / "red.png"
        image.write_bytes(png())
        status, out, err = await ask("--image", str(image), "What is this?", env=env)
        assert status == 4, (status, out, err)  # the server refused the request
        assert "unsupported" in err and "does not read images" in err
        server.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            returncode = await asyncio.to_thread(server.wait)
        assert returncode == 0, log.read_text()
        text = log.read_text()
        assert "loaded" in text.lower()
        assert "prompt format transcript" in text
        # listening is not ready: the log says so until the model is in
        listening = text.index("Uvicorn running on")
        assert (
            listening
            < text.index("not ready yet: loading the model")
            < text.index("ready: accepting chats")
        )
