"""The openai engine's HTTP side (``engine/openai/client.py``) against a real llama.cpp server."""

from __future__ import annotations

import asyncio

from wschat.server.engine.openai.client import EngineHttp

from tests.openai.llama import LlamaServer
from tests.support import TIMEOUT

PROMPT = [2, 105, 2364, 107, 9259]  # <bos><start_of_turn>user\nHello


async def test_streams_sent_one_right_after_another_are_each_answered(
    live_llama: LlamaServer,
) -> None:
    # llama.cpp's server may close a connection it streamed a reply on: sent at once on the
    # connection of the reply before, a request failed about one time in three
    http = EngineHttp(live_llama.api_url, None)
    body = {"prompt": PROMPT, "n_predict": 2, "stream": True, "return_tokens": True}
    ends = []
    try:
        async with asyncio.timeout(TIMEOUT):
            for _ in range(24):
                chunks = [chunk async for chunk in http.stream("/completion", body, "s")]
                ends.append(chunks[-1]["stop"])
    finally:
        await http.aclose()
    assert ends == [True] * 24
