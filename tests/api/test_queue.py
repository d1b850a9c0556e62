"""API requests in the slots' queue (sessions/slots.py, sessions/generation.py): in bursts
bigger than the slots and the queue together, every request is answered, with its reply or a
429, and once they are over no slot counts as running. Clients connect from addresses of their
own on the loopback network (127.0.0.x), so that a fair share pushes queued requests out."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from tests.api.test_routes import metric
from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import TIMEOUT, http_base, running_server

BURST = 90  # from one address: more than the slots and the queue hold together (4 + 64)
OTHERS = [f"127.0.0.{n}" for n in range(2, 6)]  # each sends a few while the burst waits
ROUNDS = 4


def short(_: Any) -> Script:
    return Script([f" s{i}" for i in range(3)], delay_s=0.005)


async def streamed(http: httpx.AsyncClient, base: str) -> str:
    """One streamed chat request: ``ok`` once ``[DONE]`` came, else the error's code;
    ``unanswered`` when nothing came within the timeout."""
    body = {"model": "any", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    try:
        async with asyncio.timeout(TIMEOUT / 2):
            async with http.stream("POST", f"{base}/v1/chat/completions", json=body) as response:
                if response.status_code != 200:
                    error = json.loads(await response.aread())["error"]
                    return f"{response.status_code} {error['code']}"
                async for line in response.aiter_lines():
                    if line == "data: [DONE]":
                        return "ok"
                return "cut"
    except TimeoutError:
        return "unanswered"


async def test_bursts_of_streamed_requests_are_each_answered_and_leave_no_slot_held() -> None:
    async with running_server(ScriptedEngine(short), max_concurrent=4, max_queue=64) as url:
        base = http_base(url)
        limits = httpx.Limits(max_connections=None)
        clients = [
            httpx.AsyncClient(timeout=TIMEOUT, limits=limits, transport=transport(address))
            for address in ["127.0.0.1", *OTHERS]
        ]
        try:
            outcomes: list[str] = []
            for _ in range(ROUNDS):
                burst = [streamed(clients[0], base) for _ in range(BURST)]
                others = [streamed(c, base) for c in clients[1:] for _ in range(4)]
                outcomes += await asyncio.gather(*burst, *others)
        finally:
            for client in clients:
                await client.aclose()
        running = await metric(base, "wschat_generations_running")
        queued = await metric(base, "wschat_generations_queued")
    assert set(outcomes) <= {"ok", "429 overloaded"}, sorted(set(outcomes))
    assert outcomes.count("ok") >= ROUNDS * (4 + 64)
    assert (running, queued) == (0, 0)


def transport(address: str) -> httpx.AsyncHTTPTransport:
    return httpx.AsyncHTTPTransport(local_address=address)
