"""``POST /v1/chat/completions`` through the official ``openai`` SDK against a real uvicorn on
the tiny model: a request runs on the same engine path as a WebSocket prompt, so the same
conversation gets the same reply token for token, streamed or whole, with its usage."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import openai
from openai.types.chat import ChatCompletionMessageParam

from tests.api.support import assistant, async_client, sync_client, user, websocket_replies
from tests.support import TIMEOUT, running_server

if TYPE_CHECKING:
    from wschat.server.engine.local.hf import HFEngine


async def streamed_text(
    client: openai.AsyncOpenAI, messages: list[ChatCompletionMessageParam]
) -> str:
    stream = await client.chat.completions.create(
        model="any",
        messages=messages,
        max_tokens=12,
        stream=True,
    )
    parts = []
    async with asyncio.timeout(TIMEOUT):
        async for chunk in stream:
            parts += [c.delta.content or "" for c in chunk.choices]
    return "".join(parts)


async def test_streamed_whole_and_websocket_replies_are_the_same_text(
    tiny_engine: HFEngine,
) -> None:
    async with running_server(tiny_engine) as url, async_client(url) as client:
        first = await client.chat.completions.create(
            model="any", messages=[user("Hello there")], max_tokens=12
        )
        reply = first.choices[0].message.content
        assert reply
        conversation: list[ChatCompletionMessageParam] = [
            user("Hello there"),
            assistant(reply),
            user("And then?"),
        ]
        whole = await client.chat.completions.create(
            model="any",
            messages=conversation,
            max_tokens=12,
        )
        streamed = await streamed_text(client, conversation)
        ws = await websocket_replies(url, ["Hello there", "And then?"], max_new_tokens=12)
    assert whole.choices[0].message.content == streamed == ws[1]["text"]
    assert reply == ws[0]["text"]
    assert whole.usage is not None
    assert whole.usage.prompt_tokens == ws[1]["usage"]["prompt_tokens"]
    assert whole.usage.completion_tokens == ws[1]["usage"]["completion_tokens"]


def test_the_sync_client_gets_the_same_reply_streamed_and_whole(
    tiny_engine: HFEngine,
) -> None:
    async def serve_and_ask() -> tuple[str, str]:
        async with running_server(tiny_engine) as url:
            return await asyncio.to_thread(ask, url)

    def ask(url: str) -> tuple[str, str]:
        with sync_client(url) as client:
            whole = client.chat.completions.create(model="any", messages=[user("Hi")], max_tokens=8)
            stream = client.chat.completions.create(
                model="any", messages=[user("Hi")], max_tokens=8, stream=True
            )
            parts = [c.delta.content or "" for chunk in stream for c in chunk.choices]
        return whole.choices[0].message.content or "", "".join(parts)

    whole, streamed = asyncio.run(serve_and_ask())
    assert whole == streamed != ""


async def test_usage_counts_the_prompt_the_reply_and_the_cached_prefix(
    tiny_engine: HFEngine,
) -> None:
    async with running_server(tiny_engine) as url, async_client(url) as client:
        stream = await client.chat.completions.create(
            model="any",
            messages=[user("Count me")],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert usage.completion_tokens == 5
    assert usage.total_tokens == usage.prompt_tokens + 5
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 0
    assert [c.finish_reason for c in chunks[-2].choices] == ["length"]


async def test_a_stop_string_ends_the_reply_before_it(tiny_engine: HFEngine) -> None:
    async with running_server(tiny_engine) as url, async_client(url) as client:
        free = await client.chat.completions.create(
            model="any", messages=[user("Go on")], max_tokens=16
        )
        text = free.choices[0].message.content or ""
        stop = text[len(text) // 2 :][:3]
        assert stop.strip(), text
        cut = await client.chat.completions.create(
            model="any", messages=[user("Go on")], max_tokens=16, stop=stop
        )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index(stop)]


async def test_the_same_seed_samples_the_same_reply(tiny_engine: HFEngine) -> None:
    async with running_server(tiny_engine) as url, async_client(url) as client:

        async def sample(seed: int) -> str:
            reply = await client.chat.completions.create(
                model="any",
                messages=[user("Say anything")],
                max_tokens=16,
                temperature=1.0,
                seed=seed,
            )
            return reply.choices[0].message.content or ""

        first, again, other = await sample(7), await sample(7), await sample(8)
    assert first == again
    assert first != other


async def test_a_system_message_and_joined_user_messages_reach_the_prompt(
    tiny_engine: HFEngine,
) -> None:
    async with running_server(tiny_engine) as url, async_client(url) as client:
        alone = await client.chat.completions.create(
            model="any", messages=[user("One")], max_tokens=4
        )
        with_system = await client.chat.completions.create(
            model="any",
            messages=[{"role": "system", "content": "Be brief."}, user("One"), user("Two")],
            max_tokens=4,
        )
    assert alone.usage is not None and with_system.usage is not None
    assert with_system.usage.prompt_tokens > alone.usage.prompt_tokens


async def test_max_tokens_past_the_servers_cap_is_served_up_to_the_cap(
    tiny_engine: HFEngine,
) -> None:
    """As llama.cpp does: clients send large defaults (5000); the reply ends ``length`` at
    ``--max-new-tokens``."""
    async with (
        running_server(tiny_engine, max_new_tokens=7) as url,
        async_client(url) as client,
    ):
        chat = await client.chat.completions.create(
            model="any", messages=[user("Count to a thousand")], max_tokens=5000
        )
        newer = await client.chat.completions.create(
            model="any", messages=[user("Count to a thousand")], max_completion_tokens=5000
        )
        completion = await client.completions.create(
            model="any", prompt="Once upon", max_tokens=5000
        )
    for reply in (chat, newer, completion):
        assert reply.choices[0].finish_reason == "length"
        assert reply.usage is not None and reply.usage.completion_tokens == 7
