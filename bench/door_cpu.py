"""The server's CPU per response and per token by door (``python -m bench.door_cpu``): the same
replies over the msgpack WebSocket and the Responses API's WebSocket mode, read by clients of
about the same cost (bench/wsload.py; bench/responses.py's ``raw_streams``), on the scripted
engine (tests/fakes/scripted.py) pacing its tokens so every client keeps up, so what is counted
is the door's work and nothing of a model's.

The server runs in a child process; its CPU is read from ``/proc/<pid>/task/*/schedstat`` (every
thread's time on a CPU, in ns), which other work on the machine does not inflate as it does
wall-clock time. Each round sends one reply of ``short`` and one of ``long`` tokens through each
door, on a fresh socket each, the doors' order turning from round to round; per door the CPU of
a response (the intercept) and of a token (the slope between the two lengths), and this
process's CPU per client reply for the same.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from . import wsload
from .responses import raw_streams

DELAY_S = 0.004  # between the scripted engine's tokens: every client reads each as it comes


def serve() -> None:
    """The child: a wschat server on the scripted engine, its port on stdout; ends at SIGTERM."""
    import uvicorn
    from wschat.server.runtime.serve import uvicorn_config
    from wschat.server.settings import Settings
    from wschat.server.web.app import build_app

    from tests.fakes.scripted import Script, ScriptedEngine

    def paced(request: Any) -> Script:
        n = request.params.max_new_tokens
        return Script([f" w{i}" for i in range(n)], delay_s=DELAY_S, end_with_eos=False)

    async def main() -> None:
        settings = Settings(ping_interval_s=0.0, log_level="warning")
        server = uvicorn.Server(
            uvicorn_config(settings, build_app(settings, ScriptedEngine(paced)))
        )
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)  # a client may connect before the server accepts: it waits
        print(sock.getsockname()[1], flush=True)

        def stop() -> None:
            server.should_exit = True

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop)
        await server.serve(sockets=[sock])

    asyncio.run(main())


def cpu_s(pid: int) -> float:
    """The CPU time of every thread of ``pid`` so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


Door = Callable[[str, int], Awaitable[Any]]


async def measure(pid: int, url: str, rounds: int, short: int, long: int) -> dict[str, Any]:
    doors: dict[str, Door] = {
        "msgpack": lambda text, n: wsload.concurrent(url, [text], n),
        "responses": lambda text, n: raw_streams(url, [text], n),
    }
    names = tuple(doors)
    spent = {(d, n, who): 0.0 for d in names for n in (short, long) for who in ("server", "client")}
    for name in names:  # warm-up
        await doors[name]("warm up", 4)
    for r in range(rounds):
        for name in names[r % 2 :] + names[: r % 2]:
            for n in (short, long):
                server, client = cpu_s(pid), time.process_time()
                await doors[name](f"({r:03d}) tell me a story", n)
                spent[name, n, "client"] += time.process_time() - client
                spent[name, n, "server"] += cpu_s(pid) - server
    out: dict[str, Any] = {}
    for name in names:
        for who in ("server", "client"):
            a, b = spent[name, short, who] / rounds, spent[name, long, who] / rounds
            token = (b - a) / (long - short)
            out[f"{name} {who}"] = {
                "response_ms": 1e3 * (a - short * token),
                "token_ms": 1e3 * token,
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--short", type=int, default=8)
    parser.add_argument("--long", type=int, default=128)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.door_cpu", "--serve"],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert child.stdout is not None
        url = f"ws://127.0.0.1:{int(child.stdout.readline())}/v1/chat"
        figures = asyncio.run(measure(child.pid, url, args.rounds, args.short, args.long))
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(30)
    print(f"{args.rounds} rounds of {args.short} and {args.long} tokens; CPU in ms")
    for row, f in figures.items():
        print(f"  {row:18} per response {f['response_ms']:6.2f}   per token {f['token_ms']:6.3f}")


if __name__ == "__main__":
    main()
