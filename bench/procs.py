"""The processes a run starts, each stopped by its pid: the servers under test (wschat, ``python -m
wschat.server``), the peers (``transformers serve``, llama.cpp's server) and a busy neighbour (a
CPU-bound process pinned to one core)."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence, Set
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from .inprocess import PROMPT_FORMAT

START_TIMEOUT = 240.0


@dataclass(frozen=True, slots=True)
class Running:
    process: subprocess.Popen[bytes]
    base: str  # http://127.0.0.1:<port>
    log: Path

    @property
    def ws_url(self) -> str:
        return self.base.replace("http://", "ws://") + "/v1/chat"

    def rss(self) -> int:
        return int(psutil.Process(self.process.pid).memory_info().rss)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_healthy(running: Running, path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if running.process.poll() is not None:
            raise RuntimeError(f"server exited with {running.process.returncode}: {running.log}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(running.base + path, timeout=2).status_code == 200:
                return
        time.sleep(0.25)
    raise RuntimeError(f"server not ready in {timeout_s:.0f} s: {running.log}")


@contextlib.contextmanager
def serving(
    command: list[str],
    path: str,
    port: int,
    log: Path,
    env: Mapping[str, str] | None = None,
    cores: Set[int] | None = None,
    timeout_s: float = START_TIMEOUT,
) -> Iterator[Running]:
    """``command``, a server on ``port``, once ``path`` answers; stopped on leaving. Its output
    goes to ``log``; ``env`` is added to its environment; pinned to ``cores`` when given."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    # pinned before it starts, so every thread it makes inherits the cores
    pin = None if cores is None else functools.partial(os.sched_setaffinity, 0, set(cores))
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=pin
        )
    running = Running(process, f"http://127.0.0.1:{port}", log)
    try:
        _wait_healthy(running, path, timeout_s)
        yield running
    finally:
        _stop(process)


@contextlib.contextmanager
def wschat(
    engine: str,
    logs: Path,
    sessions: int = 1100,
    extra: Sequence[str] = (),
    name: str | None = None,
    env: Mapping[str, str] | None = None,
    cores: Set[int] | None = None,
    module: str = "wschat.server",
    timeout_s: float = START_TIMEOUT,
) -> Iterator[Running]:
    """``python -m wschat.server`` (or ``module``, which takes its options) on the embedded
    model; ``sessions`` connections allowed; ``extra`` options after ours (a later ``--model``
    wins), ``env`` added to its environment, pinned to ``cores`` when given; its log is
    ``logs/<name or wschat-engine>.log``; ``timeout_s`` to be ready."""
    port = free_port()
    command = [
        sys.executable, "-m", module,
        "--model", "embedded",
        "--engine", engine,
        "--prompt-format", PROMPT_FORMAT,
        "--port", str(port),
        "--ping-interval-s", "0",
        "--max-connections", str(sessions),
        "--max-connections-per-client", str(sessions),
        "--log-level", "warning",
        *extra,
    ]  # fmt: skip
    log = logs / f"{name or f'wschat-{engine}'}.log"
    with serving(command, "/readyz", port, log, env, cores, timeout_s) as running:
        yield running


@contextlib.contextmanager
def wschat_llamacpp(
    threads: int,
    slots: int,
    slot_context: int,
    logs: Path,
    cores: Set[int] | None = None,
    engine_cores: Set[int] | None = None,
    name: str = "wschat-llamacpp",
) -> Iterator[Running]:
    """``wschat --engine llamacpp``: wschat on ``cores`` and the llama.cpp server it starts
    (``threads`` threads, ``slots`` slots of ``slot_context`` tokens) moved to ``engine_cores``
    once ready, every thread of it (a child starts on its parent's cores); log
    ``logs/<name>.log``."""
    extra = (
        "--threads", str(threads),
        "--max-concurrent", str(slots),
        "--context-tokens", str(slot_context),
    )  # fmt: skip
    with wschat("llamacpp", logs, 64, extra, name=name, cores=cores) as running:
        if engine_cores is not None:
            for child in psutil.Process(running.process.pid).children():
                pin_threads(child.pid, engine_cores)
        yield running


def pin_threads(pid: int, cores: Set[int]) -> None:
    """Every thread of the process ``pid`` on ``cores`` (an affinity is a thread's own)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(int(task.name), set(cores))


# Spins on one core until stopped; exits by itself once its parent is gone (the parent died
# without stopping it), so no neighbour outlives a run.
_BUSY_LOOP = """
import os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
parent = int(sys.argv[2])  # passed in: the parent may be gone before this line runs
while os.getppid() == parent:
    for _ in range(100_000):
        pass
"""


def neighbour_core() -> int:
    """The core a busy neighbour takes: the last this process may run on."""
    return max(os.sched_getaffinity(0))


@contextlib.contextmanager
def busy_neighbour(core: int) -> Iterator[subprocess.Popen[bytes]]:
    """A CPU-bound process pinned to ``core`` while in the block; stopped by its pid after,
    whatever happens in the block."""
    process = subprocess.Popen([sys.executable, "-c", _BUSY_LOOP, str(core), str(os.getpid())])
    try:
        yield process
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def peer_available() -> str | None:
    """Why ``transformers serve`` cannot run here, or None when it can."""
    if shutil.which("transformers") is None:
        return "the transformers CLI is not on PATH"
    try:
        import fastapi  # noqa: F401
        import openai  # noqa: F401
    except ImportError as missing:
        return f"transformers serve needs transformers[serving] ({missing.name} is missing)"
    return None


@contextlib.contextmanager
def transformers_serve(model_dir: Path, batching: bool, logs: Path) -> Iterator[Running]:
    port = free_port()
    command = [
        "transformers", "serve", str(model_dir),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--device", "cpu",
        "--continuous-batching" if batching else "--no-continuous-batching",
    ]  # fmt: skip
    name = "peer-cb" if batching else "peer"
    with serving(command, "/health", port, logs / f"{name}.log") as running:
        yield running


@contextlib.contextmanager
def llama_cpp(
    threads: int,
    slots: int,
    slot_context: int,
    logs: Path,
    cores: Set[int] | None = None,
    name: str = "llama-cpp",
) -> Iterator[Running]:
    """llama.cpp's server (``xllamacpp``) on the embedded GGUF: ``slots`` requests at once, each
    with ``slot_context`` KV tokens; ``swa_full`` as the tests and compose run it; pinned to
    ``cores`` when given; its log ``logs/<name>.log``."""
    port = free_port()
    command = [
        sys.executable, "-m", "wschat.server.runtime.llamacpp",
        "--port", str(port),
        "--threads", str(threads),
        "--parallel", str(slots),
        "--ctx", str(slots * slot_context),
        "--swa-full",
    ]  # fmt: skip
    with serving(command, "/health", port, logs / f"{name}.log", cores=cores) as running:
        yield running
