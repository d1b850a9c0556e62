"""The ``wschat`` command as a subprocess (``python -m wschat.client``): started, fed lines,
read until a text, waited for, as the tests that run it drive it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from tests.client.engines import WAIT
from tests.fakes.scripted import Script, ScriptedEngine

ROOT = Path(__file__).resolve().parents[2]
W8 = "".join(f" w{i}" for i in range(8))  # the default scripted reply, ended on its own


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WSCHAT_")}
    return {**env, "HF_HUB_OFFLINE": "1", **extra}


async def start_cli(*args: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "wschat.client",
        *args,
        cwd=ROOT,
        env=env or cli_env(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


@contextlib.asynccontextmanager
async def cli(*args: str, env: dict[str, str] | None = None) -> AsyncIterator[CliProcess]:
    process = await start_cli(*args, env=env)
    try:
        yield CliProcess(process)
    finally:
        if process.returncode is None:
            process.kill()
        async with asyncio.timeout(WAIT):
            await process.wait()


async def run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    async with cli(*args, env=env) as process:
        async with asyncio.timeout(WAIT):
            out, err = await process.process.communicate()
        assert process.process.returncode is not None
        return process.process.returncode, out.decode(), err.decode()


class CliProcess:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.output = ""  # stdout not yet matched by ``read_until``

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        async with asyncio.timeout(WAIT):
            await self.process.stdin.drain()

    async def read_until(self, needle: str) -> str:
        """Stdout up to and including ``needle``."""
        assert self.process.stdout is not None
        async with asyncio.timeout(WAIT):
            while needle not in self.output:
                chunk = await self.process.stdout.read(4096)
                assert chunk, f"stdout ended before {needle!r}; got {self.output!r}"
                self.output += chunk.decode()
        head, _, self.output = self.output.partition(needle)
        return head + needle

    async def stderr_line(self) -> str:
        assert self.process.stderr is not None
        async with asyncio.timeout(WAIT):
            return (await self.process.stderr.readline()).decode()

    async def exit_status(self) -> int:
        async with asyncio.timeout(WAIT):
            return await self.process.wait()

    async def stderr(self) -> str:
        assert self.process.stderr is not None
        async with asyncio.timeout(WAIT):
            return (await self.process.stderr.read()).decode()


def scripts_in_turn(*scripts: Script) -> ScriptedEngine:
    """An engine whose n-th generation follows the n-th script."""
    pending: Iterator[Script] = iter(scripts)
    return ScriptedEngine(lambda request: next(pending))
