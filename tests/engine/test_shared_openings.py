"""New conversations share the KV state of their common opening (``kvstore.KVStore``'s openings),
on both local engines, on the tiny random Gemma 3 in float32: a new session whose prompt starts
with a kept opening prefills only what follows it, replies exactly as without the pool, and
leaves the opening's tensors as they were; another system prompt is another opening."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch
from wschat.server.engine import Chat, Finished, SamplingParams, Turn
from wschat.server.engine.local.kvstore import MIN_OPENING_TOKENS, SHARED_OPENINGS
from wschat.server.engine.local.loader import LoadedModel
from wschat.server.settings import Settings

from tests.engine.local_turns import WINDOW, Engine, load_widened, make_engine
from tests.support import collect, raw_peer, running_server

SYSTEM = "Be brief."  # gemma-turns opens with 8 ids: the prompts below fit the window (16)


@pytest.fixture(params=["generate", "batched"])
async def engines(
    request: pytest.FixtureRequest, tiny_text_loaded: LoadedModel
) -> AsyncIterator[tuple[Engine, Engine]]:
    """The engine with its openings on, and one with none (``--shared-openings 0``)."""
    pooled = make_engine(tiny_text_loaded, request.param)
    plain = make_engine(tiny_text_loaded, request.param, shared_openings=0)
    yield pooled, plain
    await pooled.aclose()
    await plain.aclose()


async def session(engine: Engine, key: str, system: str | None = SYSTEM) -> Chat:
    chat = Chat(engine, key)
    await chat.set_system(system, min_turn_tokens=8)
    return chat


async def say(chat: Chat, text: str, tokens: int = 6) -> Finished:
    prepared = await chat.prepare(Turn(text, SamplingParams(tokens)), max_user_tokens=100)
    _, finished = await collect(chat.start(prepared))
    assert finished.error is None and finished.usage is not None
    return finished


def opening_length(engine: Engine, system: str = SYSTEM) -> int:
    fmt = engine.prompt_format
    return len(fmt.opening(fmt.tokenize_system(system)))


def pooled_tensors(engine: Engine) -> list[torch.Tensor]:
    """Every tensor the store's openings hold (either engine's form)."""
    held: list[torch.Tensor] = []
    for entry in engine.kv.shared_openings().values():
        cache = entry.cache
        if hasattr(cache, "tensors"):
            held += cache.tensors()
        else:
            held += [t for layer in cache.layers for t in (layer.keys, layer.values)]
    return held


def cached(finished: Finished) -> int:
    assert finished.usage is not None
    return finished.usage.cached_tokens


async def test_a_new_session_reuses_the_opening_and_replies_as_without_it(
    engines: tuple[Engine, Engine],
) -> None:
    pooled, plain = engines
    n = opening_length(pooled)
    assert MIN_OPENING_TOKENS <= n < WINDOW
    first = await say(await session(pooled, "a"), "Hi")
    assert cached(first) == 0 and pooled.kv.has_opening(first_ids(pooled, "Hi")[:n])
    kept = [t.clone() for t in pooled_tensors(pooled)]
    for key, texts in (("b", ["Yo", "And then?"]), ("c", ["Hey", "Why"])):
        chat, alone = await session(pooled, key), await session(plain, key)
        for turn, text in enumerate(texts):
            shared, unshared = await say(chat, text), await say(alone, text)
            assert shared.completion_ids == unshared.completion_ids
            if turn == 0:
                assert (cached(shared), cached(unshared)) == (n, 0)
    assert not plain.kv.shared_openings()
    # read by every session, written by none
    after = pooled_tensors(pooled)
    assert len(after) == len(kept)
    assert all(torch.equal(a, b) for a, b in zip(after, kept, strict=True))
    assert len(pooled.kv.shared_openings()) == 1


def first_ids(engine: Engine, text: str, system: str = SYSTEM) -> list[int]:
    chat = Chat(engine, "probe")
    chat.conversation.set_system(system)
    return chat.conversation.prompt_ids(chat.conversation.tokenize_user(text))


async def test_another_system_prompt_is_another_opening(engines: tuple[Engine, Engine]) -> None:
    pooled, _ = engines
    await say(await session(pooled, "a"), "Hi")
    other = await say(await session(pooled, "b", "Be kind."), "Hi")
    assert cached(other) == 0  # "Be brief." opens the same markup, then parts
    again = await say(await session(pooled, "c", "Be kind."), "Yo")
    assert cached(again) == opening_length(pooled, "Be kind.")
    assert len(pooled.kv.shared_openings()) == 2


async def test_a_session_after_a_reset_starts_from_the_opening(
    engines: tuple[Engine, Engine],
) -> None:
    pooled, plain = engines
    chat, alone = await session(pooled, "a"), await session(plain, "a")
    for turn in ("Hi", "More"):
        await say(chat, turn)
        await say(alone, turn)
    chat.reset()
    alone.reset()
    shared, unshared = await say(chat, "Yo"), await say(alone, "Yo")
    assert cached(shared) == opening_length(pooled) and cached(unshared) == 0
    assert shared.completion_ids == unshared.completion_ids


async def test_an_opening_whose_first_prompt_passes_the_window_is_not_kept(
    engines: tuple[Engine, Engine],
) -> None:
    pooled, plain = engines
    text = "the cat sat on a mat and " * 3  # the prompt is past the window of 16
    await say(await session(pooled, "a"), text)
    assert not pooled.kv.shared_openings()
    shared, unshared = (
        await say(await session(pooled, "b"), text),
        await say(await session(plain, "b"), text),
    )
    assert cached(shared) == 0 and shared.completion_ids == unshared.completion_ids


async def test_a_second_new_session_over_a_server_reports_the_opening_as_cached(
    engines: tuple[Engine, Engine],
) -> None:
    pooled, _ = engines
    async with running_server(pooled) as url:
        cached = [await first_prompt(url, text) for text in ("Hi", "Yo")]
    assert cached == [0, opening_length(pooled)]


async def first_prompt(url: str, text: str, system: str | None = SYSTEM, query: str = "") -> int:
    """A new session's first prompt over ``url`` (``?query``: its token) after ``configure``
    with ``system`` (none: no configure); its ``cached_tokens``, which ``start`` and
    ``done.usage`` report alike."""
    async with raw_peer(f"{url}?{query}" if query else url) as (peer, _ready):
        if system is not None:
            await peer.send({"type": "configure", "system": system})
            await peer.recv_until("configured")
        await peer.send(
            {"type": "prompt", "id": "p", "text": text, "params": {"max_new_tokens": 4}}
        )
        frames = await peer.recv_until("done")
    start, done = frames[0], frames[-1]
    assert start["type"] == "start" and done["reason"] == "length"
    assert done["usage"]["cached_tokens"] == start["cached_tokens"]
    return int(start["cached_tokens"])


async def test_an_opening_with_a_system_prompt_is_shared_only_by_its_tokens_sessions(
    engines: tuple[Engine, Engine],
) -> None:
    """A client's system prompt is its own: whether another client's sessions used it is not
    to be read from ``cached_tokens``."""
    pooled, _ = engines
    async with running_server(pooled, tokens=("alice", "bob")) as url:
        cached = [
            await first_prompt(url, text, query=f"token={token}")
            for token, text in (("alice", "Hi"), ("bob", "Yo"), ("alice", "Hey"), ("bob", "Why"))
        ]
    n = opening_length(pooled)
    assert cached == [0, 0, n, n]


@pytest.fixture(scope="module")
def wide_text_loaded(tiny_text_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_widened(tiny_text_dir, tmp_path_factory)


@pytest.fixture(params=["generate", "batched"])
async def transcript_engine(
    request: pytest.FixtureRequest, wide_text_loaded: LoadedModel
) -> AsyncIterator[Engine]:
    """The transcript format (whose opening without a system prompt, its instruction and
    examples, is long enough to keep) on a window that holds it."""
    made = make_engine(wide_text_loaded, request.param, prompt_format="transcript")
    yield made
    await made.aclose()


async def test_an_opening_without_a_system_prompt_is_shared_by_every_token(
    transcript_engine: Engine,
) -> None:
    engine = transcript_engine
    n = len(engine.prompt_format.opening(None))
    assert n >= MIN_OPENING_TOKENS
    async with running_server(engine, tokens=("alice", "bob", "carol")) as url:
        cached = [
            await first_prompt(url, text, None, f"token={token}")
            for token, text in (("alice", "Hi"), ("bob", "Yo"), ("carol", "Hey"))
        ]
    assert cached == [0, n, n]


async def test_another_tokens_system_prompts_evict_its_own_openings_not_others(
    transcript_engine: Engine,
) -> None:
    """One token's sessions with more system prompts than there are openings give up their own
    openings: another token's stays, and so does the one without a system prompt."""
    engine = transcript_engine
    everyones = len(engine.prompt_format.opening(None))
    alices = opening_length(engine)
    async with running_server(engine, tokens=("alice", "bob")) as url:
        assert await first_prompt(url, "Hi", None, "token=alice") == 0
        assert await first_prompt(url, "Hi", SYSTEM, "token=alice") == 0
        for n in range(SHARED_OPENINGS):
            assert await first_prompt(url, "Yo", f"Rule {n}.", "token=bob") == 0
        cached = [
            await first_prompt(url, "Hey", system, "token=alice") for system in (None, SYSTEM)
        ]
    assert cached == [everyones, alices]


async def test_a_resumed_session_shares_the_openings_of_the_token_that_resumed_it(
    engines: tuple[Engine, Engine],
) -> None:
    """The resume token proves the right to the session; its openings are then those of the
    connection's token, not of the one that began it."""
    pooled, _ = engines
    n = opening_length(pooled)
    async with running_server(pooled, tokens=("alice", "bob")) as url:
        assert await first_prompt(url, "Hi", query="token=alice") == 0
        async with raw_peer(f"{url}?token=alice") as (peer, ready):
            await peer.send({"type": "configure", "system": SYSTEM})
            await peer.recv_until("configured")
        resumed = f"resume={ready['resume']}&token=bob"
        async with raw_peer(f"{url}?{resumed}") as (peer, again):
            assert again["session"] == ready["session"]
            await peer.send(
                {"type": "prompt", "id": "p", "text": "Yo", "params": {"max_new_tokens": 4}}
            )
            frames = await peer.recv_until("done")
        assert frames[0]["type"] == "start" and frames[0]["cached_tokens"] == 0
        assert await first_prompt(url, "Why", query="token=bob") == n
        assert await first_prompt(url, "Hey", query="token=alice") == n


def test_the_servers_default_is_the_stores() -> None:
    assert Settings().shared_openings == SHARED_OPENINGS > 0
