"""A client that leaves an HTTP stream mid-reply (the chat API's, the Responses API's) cancels
it as a WebSocket ``cancel`` does: the door feeds the session's core the cancel, the core's
table answers it (sessions/core.py ``_cancel_run``), the run ends ``cancelled`` and its slot is
free. Against a real uvicorn, with httpx reading the stream raw and a raw WebSocket peer."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.api.support import user
from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import TIMEOUT, http_base, raw_peer, running_server, wait_until

if TYPE_CHECKING:
    from wschat.server.engine import GenerationRequest

LONG = 1000  # a reply that runs for minutes unless cancelled

CHAT = "/v1/chat/completions", {"messages": [user("Hi")], "max_tokens": LONG}
RESPONSES = "/v1/responses", {"input": "Hi", "max_output_tokens": LONG}


def slow_when_long(request: GenerationRequest) -> Script:
    """A reply of 4 words, or, for ``LONG`` tokens, one that runs for minutes unless cancelled."""
    n = request.params.max_new_tokens
    return Script([f" w{i}" for i in range(n)], delay_s=0.2 if n >= LONG else 0.0)


def core_lines(caplog: pytest.LogCaptureFixture) -> dict[str, list[str]]:
    """What the session cores logged, per session key (in the order the sessions first logged),
    each line without its ``session <key>: ``."""
    lines: dict[str, list[str]] = {}
    for record in caplog.records:
        if record.name == "wschat.session" and isinstance(record.args, tuple):
            key = str(record.args[0])
            lines.setdefault(key, []).append(record.getMessage().removeprefix(f"session {key}: "))
    return lines


def both_ended(caplog: pytest.LogCaptureFixture) -> bool:
    """The WebSocket session's run and the HTTP request's have both ended."""
    lines = [*core_lines(caplog).values()]
    return len(lines) == 2 and all("running -> idle" in session for session in lines)


async def run_id_once_a_token_came(lines: AsyncIterator[str]) -> str:
    """The stream's run id (a chunk's ``id``, the response's), once a token of its reply came."""
    run_id = ""
    async for line in lines:
        if not line.startswith("data: "):
            continue
        event: dict[str, Any] = json.loads(line.removeprefix("data: "))
        if "response" in event:
            run_id = event["response"]["id"]
        elif "choices" in event:
            run_id = event["id"]
        if event.get("type") == "response.output_text.delta" or any(
            c["delta"].get("content") for c in event.get("choices", [])
        ):
            return run_id
    raise AssertionError("the stream ended before a token came")


async def cancellations(http: httpx.AsyncClient, base: str) -> float:
    text = (await http.get(f"{base}/metrics")).text
    name = "wschat_cancellations_total "
    return float(next(line for line in text.splitlines() if line.startswith(name)).split()[-1])


@pytest.mark.parametrize(("path", "fields"), [CHAT, RESPONSES], ids=["chat", "responses"])
async def test_a_client_leaving_a_stream_mid_reply_cancels_it_as_a_websocket_cancel_does(
    caplog: pytest.LogCaptureFixture, path: str, fields: dict[str, Any]
) -> None:
    engine = ScriptedEngine(slow_when_long)
    async with (
        running_server(engine, max_concurrent=1) as url,
        raw_peer(url) as (peer, _),
        httpx.AsyncClient(timeout=TIMEOUT) as http,
    ):
        caplog.set_level(logging.DEBUG, logger="wschat.session")
        base = http_base(url)
        await peer.send(
            {"type": "prompt", "id": "p1", "text": "Hi", "params": {"max_new_tokens": LONG}}
        )
        await peer.recv_until("token")
        await peer.send({"type": "cancel", "id": "p1"})
        done = (await peer.recv_until("done"))[-1]
        body = {"model": "any", "stream": True, **fields}
        async with http.stream("POST", base + path, json=body) as stream:
            assert stream.status_code == 200
            run_id = await run_id_once_a_token_came(stream.aiter_lines())
        # the client has gone mid-reply: its run ends and gives the one slot back
        await wait_until(lambda: both_ended(caplog))
        websocket, left = core_lines(caplog).values()
        # the one slot is free: a short request is answered
        short = {"model": "any", "messages": [user("Hi")], "max_tokens": 4}
        after = await http.post(base + "/v1/chat/completions", json=short)
        cancelled = await cancellations(http, base)
    assert done["reason"] == "cancelled"
    assert websocket == [
        "idle -> queued",
        "queued -> running",
        "p1 cancelled",
        "running -> idle",
    ]
    assert left == [
        "idle -> queued",
        "queued -> running",
        f"{run_id} cancelled",
        "running -> idle",
    ]
    assert cancelled == 2
    assert after.json()["choices"][0]["message"]["content"] == " w0 w1 w2 w3"
