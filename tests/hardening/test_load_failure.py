"""A model that cannot load ends the server: a non-zero exit with the reason in the log, never a
server that closes every chat with "the model is still loading" forever. An unknown engine is
refused when the arguments are read, before anything loads."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from wschat.server.engine import Engine

from tests.support import TIMEOUT, free_port, http_base, running_server

ROOT = Path(__file__).resolve().parents[2]
EXIT_TIMEOUT = 120.0  # imports torch and transformers first: slow on a busy machine


@asynccontextmanager
async def server_process(args: list[str], log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """``python -m ARGS`` from the checkout with stderr in ``log``; killed by pid if still up."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    with log.open("wb") as sink:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", *args, cwd=ROOT, env=env, stderr=sink
        )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
        async with asyncio.timeout(TIMEOUT):
            await proc.wait()


async def exit_status(proc: asyncio.subprocess.Process, log: Path) -> int:
    try:
        async with asyncio.timeout(EXIT_TIMEOUT):
            return await proc.wait()
    except TimeoutError:
        raise AssertionError(
            f"still running after {EXIT_TIMEOUT:.0f} s; log:\n{log.read_text()}"
        ) from None


async def test_a_model_folder_whose_weights_cannot_load_exits_non_zero_with_the_reason(
    tmp_path: Path,
) -> None:
    # a folder that does not exist is refused before the start (tests/runtime/test_cli.py), and
    # one with no config or no weights too (tests/runtime/test_model_checks.py): this one has
    # both, and its weights are not a safetensors file
    missing = tmp_path / "broken-model"
    missing.mkdir()
    (missing / "config.json").write_text('{"model_type": "gemma3_text"}')
    (missing / "model.safetensors").write_bytes(b"not a safetensors file")
    log = tmp_path / "server.log"
    args = ["wschat.server", "--model", str(missing), "--port", str(free_port())]
    async with server_process(args, log) as proc:
        status = await exit_status(proc, log)
    text = log.read_text()
    assert status == 1, text
    assert "the model failed to load: Error while deserializing header" in text


async def test_an_engine_factory_that_raises_exits_non_zero_with_the_reason(
    tmp_path: Path,
) -> None:
    log = tmp_path / "server.log"
    args = ["tests.hardening.scripted_server", str(free_port()), "--fail-load"]
    async with server_process(args, log) as proc:
        status = await exit_status(proc, log)
    text = log.read_text()
    assert status == 1, text
    assert "the model failed to load" in text
    assert "RuntimeError: the scripted engine refuses to load" in text


async def test_an_unknown_engine_is_refused_when_the_arguments_are_read(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    args = ["wschat.server", "--engine", "bogus", "--port", str(free_port())]
    async with server_process(args, log) as proc:
        status = await exit_status(proc, log)
    text = log.read_text()
    assert status == 2, text
    assert "argument --engine: invalid choice: 'bogus'" in text
    assert "Traceback" not in text


async def test_healthz_turns_503_once_the_load_has_failed() -> None:
    def refuse() -> Engine:
        raise RuntimeError("no model here")

    async with (
        running_server(refuse) as url,
        httpx.AsyncClient(base_url=http_base(url), timeout=TIMEOUT) as http,
    ):
        async with asyncio.timeout(TIMEOUT):
            while (await http.get("/readyz")).json()["status"] == "loading":
                await asyncio.sleep(0.01)  # the load runs in a thread: nothing to await here
        health = await http.get("/healthz")
        ready = await http.get("/readyz")
    assert (health.status_code, health.text) == (503, "failed: the model failed to load\n")
    assert (ready.status_code, ready.json()) == (503, {"ready": False, "status": "failed"})
