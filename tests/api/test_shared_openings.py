"""An API request starts from the KV state of its conversation's opening (``KVStore``'s
openings) only where a request of the same owner, its bearer token, left it: with a system
prompt, whether it is cached says something about what another client sent."""

from __future__ import annotations

from typing import TYPE_CHECKING

from openai.types.chat import ChatCompletionMessageParam

from tests.api.support import async_client, user
from tests.support import running_server

if TYPE_CHECKING:
    from wschat.server.engine.local.hf import HFEngine

SYSTEM = "Be brief."  # gemma-turns opens with 8 ids: the prompts below fit the window (16)


async def test_an_opening_with_a_system_message_serves_only_its_api_keys_requests(
    tiny_engine: HFEngine,
) -> None:
    fmt = tiny_engine.prompt_format
    opening = len(fmt.opening(fmt.tokenize_system(SYSTEM)))
    cached: list[int] = []
    async with running_server(tiny_engine, tokens=("alice", "bob")) as url:
        for token, text in (("alice", "Hi"), ("bob", "Yo"), ("alice", "Hey")):
            messages: list[ChatCompletionMessageParam] = [
                {"role": "system", "content": SYSTEM},
                user(text),
            ]
            async with async_client(url, token) as client:
                # a reply as long as the prompt: the next request of its key shares less than
                # half of what the key holds, so it takes a key of its own (prefix_keys.py)
                reply = await client.chat.completions.create(
                    model="any", messages=messages, max_tokens=12
                )
            assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
            cached.append(reply.usage.prompt_tokens_details.cached_tokens or 0)
    assert cached == [0, 0, opening]
