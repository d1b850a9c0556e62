"""A local engine that runs out of memory in a forward (the GPU's or the host's) ends that reply
``overloaded`` with when to retry, not as a failure of ours; what the failed step held is freed
and the next prompt is answered as if nothing had happened.

The model's forward raises here as torch raises, on a CPU: the CUDA path (``empty_cache``) is
not run by these tests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import torch
from wschat.protocol import FinishReason
from wschat.server.engine import (
    EngineOverloaded,
    Finished,
    Generation,
    GenerationRequest,
    SamplingParams,
    TokenPiece,
)
from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.hf import HFEngine
from wschat.server.engine.local.loader import LoadedModel
from wschat.server.engine.local.options import LocalEngineOptions

from tests.support import TIMEOUT, RawPeer, collect, raw_peer, running_server

LONG = SamplingParams(max_new_tokens=24)  # a reply still decoding when the next prompt comes
SHORT = SamplingParams(max_new_tokens=8)
LENGTH = FinishReason.LENGTH

# what torch raises when the GPU's memory, Python's, or its CPU allocator's runs out
OUT_OF_MEMORY = {
    "cuda": torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
    "host": MemoryError(),
    "cpu allocator": RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate"
        " memory: you tried to allocate 1125899906842624 bytes. Error code 12"
    ),
}


@pytest.fixture(params=["generate", "batched"])
async def engine(
    request: pytest.FixtureRequest, tiny_text_loaded: LoadedModel
) -> AsyncIterator[HFEngine | BatchedEngine]:
    built: HFEngine | BatchedEngine
    if request.param == "generate":
        built = HFEngine(tiny_text_loaded)
    else:
        built = BatchedEngine(tiny_text_loaded, LocalEngineOptions(width=4, prefill_tokens=32))
    yield built
    await built.aclose()


def any_forward(width: int) -> bool:
    return True


@contextlib.contextmanager
def next_forward_raises(
    model: torch.nn.Module, error: BaseException, when: Callable[[int], bool] = any_forward
) -> Iterator[None]:
    """The decoder stack's next forward for which ``when(its width in tokens)`` holds raises
    ``error`` (later ones run as before); both engines run their forwards through it."""
    decoder = model.get_submodule("model")
    original = decoder.forward
    armed = True

    def forward(*args: Any, **kwargs: Any) -> Any:
        nonlocal armed
        ids = kwargs.get("input_ids", args[0] if args else None)
        if armed and when(ids.shape[1] if ids is not None else 0):
            armed = False
            raise error
        return original(*args, **kwargs)

    vars(decoder)["forward"] = forward  # an instance attribute: nn.Module's __call__ reads it
    try:
        yield
    finally:
        del vars(decoder)["forward"]


async def ask(peer: RawPeer, frame_id: str, text: str) -> list[dict[str, Any]]:
    params = {"max_new_tokens": 8}
    await peer.send({"type": "prompt", "id": frame_id, "text": text, "params": params})
    return await peer.recv_until("done")


@pytest.mark.parametrize("kind", sorted(OUT_OF_MEMORY))
async def test_out_of_memory_in_a_forward_is_overloaded_and_the_next_prompt_works(
    engine: HFEngine | BatchedEngine, tiny_text_loaded: LoadedModel, kind: str
) -> None:
    async with running_server(engine) as url:
        async with raw_peer(url) as (peer, _):
            unharmed = (await ask(peer, "a", "hello there"))[-1]
        async with raw_peer(url) as (peer, _):
            with next_forward_raises(tiny_text_loaded.model, OUT_OF_MEMORY[kind]):
                *_, error, done = await ask(peer, "a", "hello there")
            assert (error["type"], error["code"], error["id"]) == ("error", "overloaded", "a")
            assert "retry in 1 s" in error["message"]
            assert (done["type"], done["reason"]) == ("done", "error")
            again = (await ask(peer, "b", "hello there"))[-1]
    assert (again["reason"], again["text"]) == (unharmed["reason"], unharmed["text"])
    assert unharmed["reason"] == "length"


async def test_a_batched_pass_out_of_memory_ends_its_rows_and_the_waiting_ones_go_on(
    tiny_text_loaded: LoadedModel,
) -> None:
    # one row at a time
    engine = BatchedEngine(tiny_text_loaded, LocalEngineOptions(width=1, prefill_tokens=32))
    try:
        ids = [2, *engine.tokenize_text("hello there")]
        params = SamplingParams(max_new_tokens=8)
        unharmed = await collect(engine.generate(GenerationRequest(ids, params)))
        with next_forward_raises(tiny_text_loaded.model, OUT_OF_MEMORY["cuda"]):
            failed = engine.generate(GenerationRequest(ids, params))
            waiting = engine.generate(GenerationRequest(ids, params))
            (_, failure), went_on = await collect(failed), await collect(waiting)
    finally:
        await engine.aclose()
    assert failure.reason is FinishReason.ERROR
    assert isinstance(failure.error, EngineOverloaded) and failure.error.retry_s == 1.0
    assert went_on == unharmed and unharmed[1].reason is FinishReason.LENGTH


def a_prefill(width: int) -> bool:
    return width > 1


def decode_after_a_prefill() -> Callable[[int], bool]:
    """The first decode forward (one token a row) after a prefill forward: the step of the
    pass that fed a new prompt its first chunk."""
    fed = False

    def when(width: int) -> bool:
        nonlocal fed
        fed = fed or width > 1
        return fed and width == 1

    return when


async def decoding(generation: Generation) -> str:
    """Once the generation's first token came: its text so far."""
    async with asyncio.timeout(TIMEOUT):
        items = await generation.next_items()
    assert not any(isinstance(item, Finished) for item in items)
    return "".join(item.text for item in items if isinstance(item, TokenPiece))


async def test_a_prefill_out_of_memory_ends_its_prompt_and_the_decoding_rows_go_on(
    tiny_text_loaded: LoadedModel,
) -> None:
    engine = BatchedEngine(tiny_text_loaded, LocalEngineOptions(width=2, prefill_tokens=32))
    try:
        story = GenerationRequest([2, *engine.tokenize_text("tell me a story")], LONG)
        unharmed = await collect(engine.generate(story))
        running = engine.generate(story)
        head = await decoding(running)
        with next_forward_raises(tiny_text_loaded.model, OUT_OF_MEMORY["cuda"], a_prefill):
            new = GenerationRequest([2, *engine.tokenize_text("hello there")], SHORT)
            _, failure = await collect(engine.generate(new))
        tail, end = await collect(running)
        again = await collect(engine.generate(new))
    finally:
        await engine.aclose()
    assert failure.reason is FinishReason.ERROR and isinstance(failure.error, EngineOverloaded)
    assert (head + tail, end.reason) == (unharmed[0], unharmed[1].reason) == (unharmed[0], LENGTH)
    assert again[1].reason is LENGTH


async def test_a_decode_out_of_memory_ends_the_decoding_rows_and_a_prompt_being_fed_goes_on(
    tiny_text_loaded: LoadedModel,
) -> None:
    # a prompt of 3 chunks of 16: still being fed when the step after its first chunk fails
    engine = BatchedEngine(tiny_text_loaded, LocalEngineOptions(width=2, prefill_tokens=16))
    try:
        story = GenerationRequest([2, *engine.tokenize_text("tell me a story")], LONG)
        fed = GenerationRequest([2, *range(300, 340)], SHORT)
        unharmed = await collect(engine.generate(fed))
        running = engine.generate(story)
        await decoding(running)
        when = decode_after_a_prefill()
        with next_forward_raises(tiny_text_loaded.model, OUT_OF_MEMORY["cuda"], when):
            went_on = await collect(engine.generate(fed))
            _, failure = await collect(running)
    finally:
        await engine.aclose()
    assert failure.reason is FinishReason.ERROR and isinstance(failure.error, EngineOverloaded)
    assert went_on == unharmed and unharmed[1].reason is LENGTH


async def test_a_decode_out_of_memory_ends_the_reply_with_least_done_and_runs_again(
    tiny_text_loaded: LoadedModel,
) -> None:
    engine = BatchedEngine(tiny_text_loaded, LocalEngineOptions(width=2, prefill_tokens=32))
    try:
        story = GenerationRequest([2, *engine.tokenize_text("tell me a story")], LONG)
        later = GenerationRequest([2, *engine.tokenize_text("hello there")], LONG)
        unharmed = await collect(engine.generate(story))
        first = engine.generate(story)
        head = await decoding(first)
        second = engine.generate(later)
        await decoding(second)  # both decode now, the first ahead
        with next_forward_raises(tiny_text_loaded.model, OUT_OF_MEMORY["cuda"], one_token):
            _, failure = await collect(second)
            tail, end = await collect(first)
    finally:
        await engine.aclose()
    assert failure.reason is FinishReason.ERROR and isinstance(failure.error, EngineOverloaded)
    assert (head + tail, end.reason) == (unharmed[0], LENGTH) == (unharmed[0], unharmed[1].reason)


def one_token(width: int) -> bool:
    return width == 1
