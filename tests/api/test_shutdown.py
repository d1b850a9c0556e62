"""SIGTERM with an API request streaming, on the real ``serve`` in a process of its own: the
drain gives the request its grace period as it gives a chat's reply, then cuts it with an error
event the client sees, and the process exits 0 (a request left running would hold the exit)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import openai
import pytest

from tests.api.support import async_client, user
from tests.support import TIMEOUT, server_process


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
