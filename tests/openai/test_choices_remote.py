"""``n`` choices on chat completions with ``--engine openai`` in front of the real llama.cpp
child: each choice a reply of its own to the one prompt (one request to the engine each, its
seed the request's plus its index), the prompt counted once in the usage."""

from __future__ import annotations

from typing import Any

from wschat.server.engine.openai import OpenAIEngine

from tests.api.support import async_client, user
from tests.support import running_server

# llama.cpp on 2 busy cores
SLOW = 300.0


async def test_two_choices_in_front_of_llama_cpp_come_indexed_with_the_prompt_counted_once(
    openai_engine: OpenAIEngine,
) -> None:
    ask: dict[str, Any] = {"max_tokens": 6, "temperature": 1.0, "seed": 11}
    async with running_server(openai_engine) as url, async_client(url) as client:
        slow = client.with_options(timeout=SLOW)
        one = await slow.chat.completions.create(model="m", messages=[user("Pick a word")], **ask)
        two = await slow.chat.completions.create(
            model="m", messages=[user("Pick a word")], n=2, **ask
        )
    assert [c.index for c in two.choices] == [0, 1]
    assert all(c.finish_reason in ("stop", "length") for c in two.choices)
    assert all(c.message.content for c in two.choices)
    assert one.usage is not None and two.usage is not None
    assert two.usage.prompt_tokens == one.usage.prompt_tokens  # counted once
    assert two.usage.completion_tokens >= 2
