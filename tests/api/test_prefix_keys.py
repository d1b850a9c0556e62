"""KV reuse between requests of one conversation (web/openai_api/prefix_keys.py): a client that
resends the whole conversation each turn, as OpenAI clients do, runs under the engine session
key whose kept ids share the longest prefix with its prompt, and ``cached_tokens`` says so; the
keys are bounded, busy while a request runs on them, and never shared between tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

import openai
from openai.types.chat import ChatCompletionMessageParam
from wschat.server.web.openai_api.prefix_keys import MAX_KEYS, CacheKeys

from tests.api.support import assistant, async_client, user
from tests.support import running_server

if TYPE_CHECKING:
    from wschat.server.engine.local.hf import HFEngine


async def next_turn(
    client: openai.AsyncOpenAI, conversation: list[ChatCompletionMessageParam]
) -> tuple[int, int]:
    """The conversation's next turn, sent whole and its reply added: its prompt tokens and the
    cached ones."""
    conversation.append(user(f"Turn {len(conversation) // 2}, go on"))
    reply = await client.chat.completions.create(model="any", messages=conversation, max_tokens=8)
    conversation.append(assistant(reply.choices[0].message.content or ""))
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    return reply.usage.prompt_tokens, reply.usage.prompt_tokens_details.cached_tokens or 0


async def test_a_conversation_resent_whole_gets_its_prefix_from_cache(
    tiny_engine: HFEngine,
) -> None:
    async with running_server(tiny_engine, tokens=("a", "b")) as url:
        conversation: list[ChatCompletionMessageParam] = []
        async with async_client(url, "a") as client:
            turns = [await next_turn(client, conversation) for _ in range(4)]
        prompts, cached = [t[0] for t in turns], [t[1] for t in turns]
        async with async_client(url, "b") as other:
            stranger = await other.chat.completions.create(
                model="any", messages=conversation[:-1], max_tokens=8
            )
    assert cached[0] == 0
    # each turn reads the last one's prompt and reply from cache: only its new turn is prefilled
    for n in range(1, 4):
        assert prompts[n - 1] < cached[n] < prompts[n], (cached, prompts)
    assert stranger.usage is not None and stranger.usage.prompt_tokens_details is not None
    assert stranger.usage.prompt_tokens_details.cached_tokens == 0


async def test_another_tokens_many_requests_leave_a_conversations_prefix_cached(
    tiny_engine: HFEngine,
) -> None:
    """More one-token requests of another token, each with a system prompt of its own, than
    there are keys: they evict that token's keys, not the conversation's."""
    conversation: list[ChatCompletionMessageParam] = []
    async with (
        running_server(tiny_engine, tokens=("a", "b")) as url,
        async_client(url, "a") as client,
        async_client(url, "b") as other,
    ):
        turns = [await next_turn(client, conversation) for _ in range(2)]
        for n in range(MAX_KEYS + 2):
            system: ChatCompletionMessageParam = {"role": "system", "content": f"{n}!"}
            await other.chat.completions.create(
                model="any", messages=[system, user("Hi")], max_tokens=1
            )
        prompt, cached = await next_turn(client, conversation)
    assert turns[1][0] < cached < prompt, (turns, prompt, cached)


def test_a_key_is_found_by_the_longest_common_prefix_of_its_owner() -> None:
    forgotten: list[str] = []
    keys = CacheKeys(forgotten.append)
    first = keys.acquire("a", [1, 2, 3])
    keys.release(first, [1, 2, 3, 4, 5])
    second = keys.acquire("a", [9, 9])
    keys.release(second, [9, 9, 8])
    assert keys.acquire("a", [1, 2, 3, 4, 5, 6]) == first
    assert keys.acquire("a", [9, 9, 8, 7]) == second
    assert keys.acquire("b", [1, 2, 3, 4, 5, 6]) not in (first, second)
    assert forgotten == []


def test_a_busy_key_is_not_shared_and_a_failed_one_is_forgotten() -> None:
    forgotten: list[str] = []
    keys = CacheKeys(forgotten.append)
    key = keys.acquire("a", [1, 2])
    keys.release(key, [1, 2, 3])
    busy = keys.acquire("a", [1, 2, 3, 4])
    assert busy == key
    assert keys.acquire("a", [1, 2, 3, 4]) != key  # the same conversation twice at once
    keys.release(key, None)
    assert forgotten == [key]
    assert keys.acquire("a", [1, 2, 3, 4]) != key


def test_the_keys_are_bounded_the_least_recently_used_idle_one_forgotten() -> None:
    forgotten: list[str] = []
    keys = CacheKeys(forgotten.append, max_keys=2)
    old = keys.acquire("a", [1])
    keys.release(old, [1, 1])
    recent = keys.acquire("a", [2])
    keys.release(recent, [2, 2])
    newest = keys.acquire("a", [3])
    assert forgotten == [old]
    assert len(keys) == 2
    assert keys.acquire("a", [2, 2, 2]) == recent != newest


def test_an_owner_over_its_share_of_keys_evicts_its_own() -> None:
    forgotten: list[str] = []
    keys = CacheKeys(forgotten.append, max_keys=4)
    mine = keys.acquire("a", [1])
    keys.release(mine, [1, 1])
    theirs = []
    for n in range(2, 8):  # "b" asks for six keys: more than there are
        theirs.append(keys.acquire("b", [n]))
        keys.release(theirs[-1], [n, n])
    assert forgotten == theirs[:3] and len(keys) == 4
    assert keys.acquire("a", [1, 1, 1]) == mine


def test_two_conversations_with_one_beginning_keep_a_key_each() -> None:
    keys = CacheKeys(lambda key: None)
    system = [2, 7, 7, 7]
    first = keys.acquire("a", [*system, 10, 11])
    keys.release(first, [*system, 10, 11, 12, 13])
    second = keys.acquire("a", [*system, 20, 21])  # shares the system prompt alone
    keys.release(second, [*system, 20, 21, 22, 23])
    assert second != first
    assert keys.acquire("a", [*system, 10, 11, 12, 13, 14]) == first
    assert keys.acquire("a", [*system, 20, 21, 22, 23, 24]) == second


def test_a_key_the_prompt_extends_beats_a_longer_one_it_would_cut_back() -> None:
    keys = CacheKeys(lambda key: None)
    turns = list(range(10, 40))
    whole = keys.acquire("a", turns[:10])
    keys.release(whole, turns)  # the same conversation, sent before up to its end
    again = keys.acquire("a", turns[:5])  # sent again from its start: its own key
    keys.release(again, turns[:8])
    assert again != whole
    assert keys.acquire("a", turns[:20]) == again  # extends it; would cut the other back
