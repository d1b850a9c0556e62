"""In front of llama.cpp, whose prefix cache every client shares (no salt), ``cached_tokens``
counts only what the client's own token sent (``prefixes.OwnPrefixes``): a guess at another
token's system prompt reads no more from it when it is right (the prefix-cache oracle), while a
conversation still sees its own reuse. The engine is a real llama.cpp server on the embedded
GGUF (``tests/openai/llama.py``)."""

from __future__ import annotations

from typing import Any

from wschat.server.engine.openai import OpenAIEngine

from tests.api.support import async_client
from tests.support import RawPeer, raw_peer, running_server

TOKENS = ("alice", "bob")
SECRET = "7"
SYSTEM = "The code is {}. Never tell it."


def public_start(engine: OpenAIEngine) -> list[int]:
    """The ids of alice's opening up to her secret: what the prompt format and a guess at her
    wording make known (the digits are tokens of their own)."""
    fmt = engine.prompt_format
    hers = fmt.opening(fmt.tokenize_system(SYSTEM.format(SECRET)))
    other = fmt.opening(fmt.tokenize_system(SYSTEM.format("2")))
    n = next(i for i, (a, b) in enumerate(zip(hers, other, strict=False)) if a != b)
    return hers[:n]


async def turn(peer: RawPeer, frame_id: str) -> dict[str, Any]:
    frame = {"type": "prompt", "id": frame_id, "text": "Hello", "params": {"max_new_tokens": 1}}
    await peer.send(frame)
    done: dict[str, Any] = (await peer.recv_until("done"))[-1]
    assert done["reason"] in ("stop", "length"), done
    return done


async def test_a_guess_at_another_tokens_system_prompt_reads_no_more_from_cache_when_right(
    openai_engine: OpenAIEngine,
) -> None:
    start = public_start(openai_engine)
    tokenizer = openai_engine.tokenizer
    cached: dict[str, int] = {}
    async with (
        running_server(openai_engine, tokens=TOKENS) as url,
        raw_peer(f"{url}?token=alice") as (alice, _),
        async_client(url, "bob") as bob,
    ):
        await alice.send({"type": "configure", "system": SYSTEM.format(SECRET)})
        await alice.recv_until("configured")
        turns = [await turn(alice, "a")]
        for digit in "0123456789":
            # alice chats on between the guesses: her prompt is back in one of the slots
            turns.append(await turn(alice, f"a{digit}"))
            guess = [*start, *tokenizer.tokenize_text(f"{digit}?")]
            answer = await bob.completions.create(model="any", prompt=guess, max_tokens=1)
            assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
            cached[digit] = answer.usage.prompt_tokens_details.cached_tokens or 0
    # bob is told of no more than he sent himself: the public start, from his earlier guesses
    assert max(cached.values()) <= len(start), cached
    # alice's conversation reads its earlier turns from the cache
    assert all(t["usage"]["cached_tokens"] > len(start) for t in turns[1:]), turns
