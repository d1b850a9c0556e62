"""The bench's busy neighbour: pinned to its core while in use, stopped by its pid afterwards,
also when the block fails or the bench itself dies."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from bench import procs

WAIT_S = 30.0


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    """Another process: nothing to await but its state, polled within a bound."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"not within {WAIT_S:.0f} s: {what}"
        time.sleep(0.05)


def gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def test_the_neighbour_spins_on_its_core_and_is_stopped_by_pid() -> None:
    core = procs.neighbour_core()
    assert core in os.sched_getaffinity(0)
    with procs.busy_neighbour(core) as process:
        neighbour = psutil.Process(process.pid)
        wait_for(lambda: neighbour.cpu_affinity() == [core], "pinned to its core")
        wait_for(lambda: sum(neighbour.cpu_times()[:2]) > 0.05, "busy")
        assert process.poll() is None
    assert process.returncode is not None
    assert gone(process.pid)


def test_the_neighbour_is_stopped_when_the_block_fails() -> None:
    with (
        pytest.raises(RuntimeError, match="measurement failed"),
        procs.busy_neighbour(procs.neighbour_core()) as process,
    ):
        assert process.poll() is None
        raise RuntimeError("measurement failed")
    assert process.returncode is not None
    assert gone(process.pid)


def test_the_neighbour_exits_by_itself_when_the_bench_dies() -> None:
    bench = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from bench import procs\n"
            "with procs.busy_neighbour(procs.neighbour_core()) as p:\n"
            "    print(p.pid, flush=True)\n"
            "    time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert bench.stdout is not None
        pid = int(bench.stdout.readline())
        assert not gone(pid)
    finally:
        bench.kill()  # no finally runs in it: the neighbour must notice on its own
        bench.wait(WAIT_S)
        if bench.stdout is not None:
            bench.stdout.close()
    try:
        wait_for(lambda: gone(pid), "the orphaned neighbour exited")
    finally:
        if not gone(pid):
            psutil.Process(pid).kill()


def test_a_server_started_on_cores_runs_pinned_to_them(tmp_path: Path) -> None:
    core = max(os.sched_getaffinity(0))
    port = procs.free_port()
    command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    with procs.serving(command, "/", port, tmp_path / "http.log", cores={core}) as running:
        assert psutil.Process(running.process.pid).cpu_affinity() == [core]
    assert running.process.poll() is not None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to split")
def test_wschat_llamacpp_runs_wschat_and_its_llama_cpp_each_on_their_cores(
    tmp_path: Path,
) -> None:
    front, engine = max(os.sched_getaffinity(0)), min(os.sched_getaffinity(0))
    with procs.wschat_llamacpp(1, 1, 512, tmp_path, cores={front}, engine_cores={engine}) as run:
        (child,) = psutil.Process(run.process.pid).children()
        threads = [psutil.Process(t.id) for t in child.threads()]
        assert {tuple(t.cpu_affinity()) for t in threads} == {(engine,)}
        assert psutil.Process(run.process.pid).cpu_affinity() == [front]
    wait_for(lambda: gone(child.pid), "its llama.cpp stopped with it")
