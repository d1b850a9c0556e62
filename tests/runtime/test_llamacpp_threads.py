"""``--engine llamacpp`` sizes llama.cpp's threads by our engine's busy-neighbour rule
(``engine/cores.py``) as its server starts: a real ``wschat-server`` process, its real llama.cpp
child, and a CPU-bound neighbour of the bench's own pinned to one of our cores."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest
from wschat.server.engine.cores import usable_cores

from bench.procs import busy_neighbour, neighbour_core
from tests.openai.llama import START_TIMEOUT
from tests.support import ROOT, command_until_ready, free_port, wait_until


def llamacpp_threads(server: psutil.Process) -> int:
    """The ``--threads`` the server gave its llama.cpp child."""
    (child,) = server.children()
    command = child.cmdline()
    return int(command[command.index("--threads") + 1])


async def started_with(log: Path, *options: str) -> int:
    port = free_port()
    command = [sys.executable, "-m", "wschat.server", "--engine", "llamacpp", "--port", str(port)]
    command += ["--max-concurrent", "1", "--context-tokens", "512", *options]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    async with command_until_ready(command, port, log, env, START_TIMEOUT) as process:
        return llamacpp_threads(psutil.Process(process.pid))


@pytest.mark.skipif(usable_cores() < 2, reason="one core: no thread to leave out")
async def test_auto_leaves_out_the_core_a_busy_neighbour_keeps_as_llamacpp_starts(
    tmp_path: Path,
) -> None:
    with busy_neighbour(neighbour_core()) as neighbour:
        spinning = psutil.Process(neighbour.pid)
        await wait_until(lambda: sum(spinning.cpu_times()[:2]) > 0.2)  # past its start-up
        threads = await started_with(tmp_path / "server.log")
    assert 1 <= threads <= usable_cores() - 1


async def test_a_thread_count_asked_for_is_llamacpps_whatever_the_load(tmp_path: Path) -> None:
    with busy_neighbour(neighbour_core()):
        assert await started_with(tmp_path / "server.log", "--threads", "3") == 3
