"""``python -m tests.hardening.remote_engine_figures [llama.cpp|vllm]``: the figures of a
misbehaving remote engine (``tests/fakes/openai_engine.py``) against the real ``wschat-server
--engine openai`` in a process of its own: the tokens a reply of ``max_new_tokens`` 101 got from
an engine that streams on for ever (at most 20 s, then a cancel), and what a 100 MB line, a 500
with a 200 MB body and a 50 MB chunk did to the server's RSS (its peak and what it kept, over a
baseline taken after one good reply) and to the largest ``token`` frame. Prints one line each."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from wschat.server.engine.embedded import default_cache_dir
from wschat.server.engine.openai.dialect import LLAMA_CPP
from wschat.server.engine.openai.tokenizer import load_tokenizer

from tests.fakes.openai_engine import (
    Answer,
    endless,
    megabytes,
    misbehaving_engine,
    reply,
    token,
)
from tests.support import RawPeer, command_until_ready, free_port, raw_peer

ENDLESS_FOR_S = 20.0
CASE_FOR_S = 900.0


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in KiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


async def run(dialect: str) -> None:
    tokenizer = load_tokenizer("embedded", default_cache_dir())
    (word,) = tokenizer.tokenize_text(" a")
    fine = reply(dialect, [("fine", tokenizer.tokenize_text("fine"))])
    answers: list[Answer] = []
    script = lambda path, body: answers.pop(0) if answers else fine  # noqa: E731
    async with misbehaving_engine(dialect, script) as engine:
        port = free_port()
        command = [
            sys.executable,
            "-m",
            "wschat.server.runtime.cli",
            "--port",
            str(port),
            "--engine",
            "openai",
            "--engine-url",
            engine.api_url,
            "--tokenizer",
            "embedded",
            "--ping-interval-s",
            "0",
            "--log-level",
            "warning",
        ]
        log = Path(f"/tmp/remote-engine-figures-{os.getpid()}.log")
        env = dict(os.environ)
        async with command_until_ready(command, port, log, env, 120.0) as server:
            url = f"ws://127.0.0.1:{port}/v1/chat"
            async with raw_peer(url, max_size=None) as (peer, _):
                await ask(peer, "warm")
                answers.append(endless(dialect, " a", word))
                started = time.monotonic()
                frames = await ask(peer, "endless", max_new_tokens=101, give_up_s=ENDLESS_FOR_S)
                done = frames[-1]
                print(
                    f"{dialect} endless engine, max_new_tokens 101: "
                    f"{done['usage']['completion_tokens']} tokens, reason {done['reason']}, "
                    f"{time.monotonic() - started:.1f} s; engine wrote {engine.served[-1].sent:,} "
                    f"bytes, closed early {engine.served[-1].closed_early}"
                )
                await peer.send({"type": "reset"})  # what was taken of it may fill the context
                await peer.recv_until("reset_ok", timeout=120)
                cases: list[tuple[str, Answer]] = [
                    ("a 100 MB line", Answer([b"data: ", *megabytes(100 << 20)])),
                    (
                        "a 500 with a 200 MB body",
                        Answer([b'{"error": ', *megabytes(200 << 20, b" ")], 500, {}),
                    ),
                    ("a 50 MB chunk", Answer([token(dialect, "x" * (50 << 20), [word])])),
                ]
                for name, answer in cases:
                    await measure(peer, server.pid, name, answer, answers, dialect)
                    print(f"  the engine wrote {engine.served[-1].sent:,} bytes of it")


async def measure(
    peer: RawPeer, pid: int, name: str, answer: Answer, answers: list[Answer], dialect: str
) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak starts again from here
    base, _ = rss_kib(pid)
    answers.append(answer)
    started = time.monotonic()
    frames = await ask(peer, name, give_up_s=CASE_FOR_S)
    took = time.monotonic() - started
    rss, peak = rss_kib(pid)
    largest = max((len(f["text"]) for f in frames if f["type"] == "token"), default=0)
    errors = [f["code"] for f in frames if f["type"] == "error"]
    print(
        f"{dialect} {name}: errors {errors}, done {frames[-1]['reason']}; RSS peak "
        f"+{(peak - base) / 1024:.1f} MiB, kept +{(rss - base) / 1024:.1f} MiB; largest token "
        f"frame {largest:,} bytes; {took:.1f} s"
    )


async def ask(
    peer: RawPeer, frame_id: str, give_up_s: float = 120.0, **params: Any
) -> list[dict[str, Any]]:
    """A prompt's frames up to its done; a cancel after ``give_up_s`` without one."""
    await peer.send({"type": "prompt", "id": frame_id, "text": "Hello", "params": params})
    frames: list[dict[str, Any]] = []
    deadline = time.monotonic() + give_up_s
    cancelled = False
    while not frames or frames[-1]["type"] != "done":
        left = deadline - time.monotonic()
        if left <= 0 and not cancelled:
            await peer.send({"type": "cancel"})
            cancelled, deadline = True, time.monotonic() + 30
            continue
        try:
            frames.append(await peer.recv(max(left, 0.1)))
        except TimeoutError:
            if cancelled:
                raise
    return frames


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1] if len(sys.argv) > 1 else LLAMA_CPP))
