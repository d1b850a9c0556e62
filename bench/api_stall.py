"""``python -m bench.api_stall``: how long one chat completion body with many messages holds the
server's event loop, on the embedded Gemma 3 270M (``--engine``, default batched).

A probe thread asks ``/healthz`` back to back on a connection of its own while the body is
sent and answered; the longest probe round trip in that time, less the median round trip
before it, is the stall (what every other client of the server waited, a token or a ping).
Bodies (``--kinds``):

- ``user``: N one-line user messages in a row (joined into one user turn);
- ``system``: N empty system messages, then one user message;
- ``exchanges``: N messages, user and assistant in turn, of ``--chars`` characters each (and a
  last user message when N is even).

Each body is encoded before the probe starts; one body of 101 messages goes first, unmeasured
(the server's first thread hops and tokenizer calls), then the figures: the server's status,
the time to the answer and the stall, per kind and N, one line each. On a shared machine a
probe round trip varies by a tenth of a second or so by itself: repeat a figure to trust it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from . import procs


def body(kind: str, n: int, chars: int) -> bytes:
    line = "x" * max(chars - 8, 1)
    if kind == "user":
        messages = [{"role": "user", "content": f"line {i}"} for i in range(n)]
    elif kind == "system":
        messages = [{"role": "system", "content": ""} for _ in range(n)]
        messages.append({"role": "user", "content": "Hi"})
    else:
        roles = ("user", "assistant")
        messages = [{"role": roles[i % 2], "content": f"{i:07d} {line}"} for i in range(n)]
        if n % 2 == 0:
            messages.append({"role": "user", "content": "Hi"})
    request = {"model": "any", "messages": messages, "max_tokens": 1}
    return json.dumps(request, separators=(",", ":")).encode()


class Probe:
    """``/healthz`` round trips, back to back, in a thread of its own."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.times: list[tuple[float, float]] = []  # (when it was sent, round trip)
        self._stop = threading.Event()  # set by stop(); the thread ends after its round trip
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self._stop.is_set():
                sent = time.perf_counter()
                client.get(f"{self.base}/healthz")
                self.times.append((sent, time.perf_counter() - sent))
                time.sleep(0.002)

    def stall_s(self, since: float) -> float:
        before = [rt for sent, rt in self.times if sent < since]
        during = [rt for sent, rt in self.times if sent >= since]
        # a round trip sent just before the request may be the one it held
        held = max([rt for sent, rt in self.times if sent + rt >= since], default=0.0)
        return max(held, *during, 0.0) - statistics.median(before or [0.0])


def measure(base: str, payload: bytes) -> dict[str, Any]:
    with httpx.Client(timeout=600) as client, Probe(base) as probe:
        time.sleep(0.3)  # the probe's baseline
        started = time.perf_counter()
        response = client.post(
            f"{base}/v1/chat/completions",
            content=payload,
            headers={"Content-Type": "application/json"},
        )
        answered = time.perf_counter() - started
        time.sleep(0.1)
    error = response.json().get("error") if response.status_code != 200 else None
    return {
        "status": response.status_code,
        "code": error and error.get("code"),
        "answer_s": round(answered, 3),
        "stall_s": round(probe.stall_s(started), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="batched")
    parser.add_argument("--kinds", nargs="+", default=["user", "system", "exchanges"])
    parser.add_argument("--messages", nargs="+", type=int, default=[10_000, 20_000, 40_000])
    parser.add_argument("--chars", type=int, default=16, help="characters per exchange message")
    parser.add_argument("--logs", type=Path, default=Path("/tmp/bench-api-stall"))
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="server options")
    args = parser.parse_args()
    with procs.wschat(args.engine, args.logs, extra=args.extra) as server:
        measure(server.base, body("exchanges", 101, 1000))  # the first one's start-up left out
        for kind in args.kinds:
            for n in args.messages:
                payload = body(kind, n, args.chars)
                result = measure(server.base, payload)
                size = f"{len(payload) / 2**20:.1f} MiB"
                print(json.dumps({"kind": kind, "messages": n, "body": size, **result}), flush=True)


if __name__ == "__main__":
    main()
