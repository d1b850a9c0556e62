"""SIGTERM with an API request streaming, on the real ``serve`` in a process of its own: the
drain gives the request its grace period as it gives a chat's reply, then cuts it with an error
event the client sees, and the process exits 0 (a request left running would hold the exit)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import openai
import pytest

from tests.api.support import async_client, user
from tests.api.test_routes import slots_reach
from tests.support import TIMEOUT, http_base, server_process


async def test_a_drain_cuts_a_streaming_request_after_the_grace_and_exits_0(
    tmp_path: Path,
) -> None:
    async with server_process(tmp_path / "server.log") as (proc, url), async_client(url) as client:
        stream = await client.chat.completions.create(
            model="any", messages=[user("a long one")], max_tokens=1024, stream=True
        )
        texts: list[str] = []
        with pytest.raises(openai.APIError) as cut:
            async for chunk in stream:
                texts += [c.delta.content or "" for c in chunk.choices]
                if len(texts) == 2:  # the role's empty delta, then a token: it runs
                    proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(TIMEOUT):
            returncode = await asyncio.to_thread(proc.wait)
    assert cut.value.body == {
        "message": "the reply was cut short: the server is shutting down",
        "type": "rate_limit_error",
        "param": None,
        "code": "overloaded",
    }
    assert "".join(texts).startswith(" l0 l1")
    assert returncode == 0, (tmp_path / "server.log").read_text()


async def test_a_drain_answers_queued_requests_503_shutting_down_with_retry_after(
    tmp_path: Path,
) -> None:
    log = tmp_path / "server.log"
    async with server_process(log, "--max-concurrent", "1") as (proc, url):
        base = http_base(url)
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:

            async def chat(text: str, stream: bool) -> httpx.Response:
                body = {"model": "any", "messages": [user(text)], "stream": stream}
                return await http.post(f"{base}/v1/chat/completions", json=body)

            running = asyncio.create_task(chat("a long one", True))
            await slots_reach(url, running=1, queued=0)
            queued = [asyncio.create_task(chat("Hi", stream)) for stream in (False, True, False)]
            await slots_reach(url, running=1, queued=3)
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(TIMEOUT):
                answers = await asyncio.gather(*queued)
                await running
                returncode = await asyncio.to_thread(proc.wait)
    for answer in answers:
        assert answer.status_code == 503
        assert answer.headers["retry-after"] == "1"
        assert answer.json() == {
            "error": {
                "message": "the server is shutting down",
                "type": "server_error",
                "param": None,
                "code": "overloaded",
            }
        }
    assert returncode == 0, log.read_text()
