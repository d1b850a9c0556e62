"""``GenerationRun``: one prompt from queue to ``done`` on the scripted engine, its frames
recorded: text that piles up while the socket is slow is merged, not dropped, and every run,
however it ends, sends exactly one ``done``."""

from __future__ import annotations

import asyncio
from typing import TypeVar

from wschat.protocol import (
    Done,
    Error,
    ErrorCode,
    FinishReason,
    Frame,
    Queued,
    Start,
    Token,
    Usage,
    encode,
)
from wschat.server.engine import (
    Chat,
    Finished,
    Generation,
    GenerationRequest,
    SamplingParams,
    Turn,
)
from wschat.server.sessions.error_boundary import Send
from wschat.server.sessions.generation import GenerationRun
from wschat.server.sessions.slots import GenerationSlots

from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import TIMEOUT

F = TypeVar("F", bound=Frame)

WORDS = [f" w{i}" for i in range(20)]


async def new_run(
    engine: ScriptedEngine, slots: GenerationSlots, stall_timeout_s: float = 120.0
) -> tuple[GenerationRun, Chat]:
    chat = Chat(engine, "s1")
    turn = Turn("hello", SamplingParams(max_new_tokens=64), [])
    prepared = await chat.prepare(turn, max_user_tokens=1024)
    return GenerationRun("g1", prepared, slots.enqueue(), stall_timeout_s=stall_timeout_s), chat


async def drive(run: GenerationRun, chat: Chat, slots: GenerationSlots, send: Send) -> None:
    async with asyncio.timeout(TIMEOUT):
        await run.drive(chat, slots, send)


def of_type(frames: list[Frame], kind: type[F]) -> list[F]:
    return [f for f in frames if isinstance(f, kind)]


async def test_text_piled_up_behind_a_slow_socket_is_merged_and_nothing_is_lost() -> None:
    # a token each 10 ms: the first frame leaves before the engine is done
    engine = ScriptedEngine(lambda request: Script(WORDS, delay_s=0.01))
    slots = GenerationSlots(1, 4)
    run, chat = await new_run(engine, slots)
    frames: list[Frame] = []

    async def slow_send(frame: Frame) -> None:
        frames.append(frame)
        if isinstance(frame, Token) and len(of_type(frames, Token)) == 1:
            # the socket is stuck until the engine has produced every token
            for worker in list(engine.threads):
                await asyncio.to_thread(worker.join, TIMEOUT)

    await drive(run, chat, slots, slow_send)
    tokens = of_type(frames, Token)
    # what the engine made while the socket was stuck leaves as one frame
    assert 1 <= len(tokens) <= 2
    assert "".join(t.text for t in tokens) == "".join(WORDS)
    assert tokens[-1].index == len(WORDS)  # the merged frame's index jumps to the count
    (done,) = of_type(frames, Done)
    assert frames[-1] is done
    assert done.reason is FinishReason.STOP and done.text == "".join(WORDS)


async def test_a_failing_generation_sends_one_internal_error_then_exactly_one_done() -> None:
    engine = ScriptedEngine(lambda request: Script(WORDS, fail_after=3))
    slots = GenerationSlots(1, 4)
    run, chat = await new_run(engine, slots)
    frames: list[Frame] = []

    async def send(frame: Frame) -> None:
        frames.append(frame)

    await drive(run, chat, slots, send)
    (error,) = of_type(frames, Error)
    assert error.code is ErrorCode.INTERNAL and error.id == "g1"
    (done,) = of_type(frames, Done)
    assert frames[-1] is done and done.reason is FinishReason.ERROR
    assert slots.running == 0  # the slot is free again


class StartFails(ScriptedEngine):
    """An engine whose start raises: an id of a restored state past int64, say."""

    def generate(self, request: GenerationRequest) -> Generation:
        raise OverflowError("Python int too large to convert to C long")


class HugeUsage(ScriptedEngine):
    """An engine that ends a reply with a count no frame can carry (a check missing)."""

    def generate(self, request: GenerationRequest) -> Generation:
        generation = Generation(prompt_tokens=len(request.prompt_ids))
        generation.push(Finished(FinishReason.STOP, text="a", usage=Usage(1, 1, 10**30)))
        return generation


async def test_a_start_that_raises_sends_an_internal_error_then_done_and_frees_the_slot() -> None:
    slots = GenerationSlots(1, 4)
    run, chat = await new_run(StartFails(), slots)
    frames: list[Frame] = []

    async def send(frame: Frame) -> None:
        frames.append(frame)

    await drive(run, chat, slots, send)  # the failure is the client's to hear, not raised
    assert [type(f) for f in frames] == [Error, Done]
    error, done = frames
    assert isinstance(error, Error) and (error.code, error.id) == (ErrorCode.INTERNAL, "g1")
    assert isinstance(done, Done) and done.reason is FinishReason.ERROR
    assert slots.running == 0


async def test_a_done_that_cannot_be_encoded_becomes_an_internal_error_and_a_bare_done() -> None:
    slots = GenerationSlots(1, 4)
    run, chat = await new_run(HugeUsage(), slots)
    frames: list[Frame] = []

    async def send(frame: Frame) -> None:  # as the connection does: encoded, then sent
        encode(frame)
        frames.append(frame)

    await drive(run, chat, slots, send)
    assert [type(f) for f in frames] == [Start, Error, Done]
    error, done = frames[1:]
    assert isinstance(error, Error) and error.code is ErrorCode.INTERNAL
    assert isinstance(done, Done) and (done.reason, done.text) == (FinishReason.ERROR, "")
    assert done.usage == Usage(0, 0, 0) and slots.running == 0


async def test_a_stalled_generation_is_stopped_with_an_error_and_exactly_one_done() -> None:
    engine = ScriptedEngine(lambda request: Script(WORDS, stall_after=2))
    slots = GenerationSlots(1, 4)
    run, chat = await new_run(engine, slots, stall_timeout_s=0.3)
    frames: list[Frame] = []

    async def send(frame: Frame) -> None:
        frames.append(frame)

    try:
        await drive(run, chat, slots, send)
    finally:
        await engine.aclose()  # its worker waits for the stall to be released
    (error,) = of_type(frames, Error)
    assert error.code is ErrorCode.INTERNAL and "no progress" in error.message
    (done,) = of_type(frames, Done)
    assert frames[-1] is done and done.reason is FinishReason.ERROR
    assert slots.running == 0


async def test_a_run_cancelled_while_queued_sends_its_position_then_done_cancelled() -> None:
    engine = ScriptedEngine(lambda request: Script(WORDS))
    slots = GenerationSlots(1, 4)
    holder = slots.enqueue()  # another session holds the only slot
    run, chat = await new_run(engine, slots)
    frames: list[Frame] = []
    queued = asyncio.Event()

    async def send(frame: Frame) -> None:
        frames.append(frame)
        if isinstance(frame, Queued):
            queued.set()

    driving = asyncio.create_task(drive(run, chat, slots, send))
    async with asyncio.timeout(TIMEOUT):
        await queued.wait()
    run.cancel()
    await driving
    assert [type(f) for f in frames] == [Queued, Done]
    assert frames[0] == Queued("g1", 1)
    assert frames[1].reason is FinishReason.CANCELLED  # type: ignore[attr-defined]
    assert engine.requests == [] and not of_type(frames, Start)
    slots.release(holder)


async def test_a_slot_granted_while_queued_is_being_sent_starts_the_run() -> None:
    engine = ScriptedEngine(lambda request: Script(WORDS[:3]))
    slots = GenerationSlots(1, 4)
    holder = slots.enqueue()  # another session holds the only slot
    run, chat = await new_run(engine, slots)
    frames: list[Frame] = []

    async def send(frame: Frame) -> None:
        frames.append(frame)
        if isinstance(frame, Queued):
            slots.release(holder)  # the grant lands while the frame is handed over
        await asyncio.sleep(0)  # as a send that waits for its reader does

    await drive(run, chat, slots, send)
    assert [type(f) for f in frames[:2]] == [Queued, Start]
    assert "".join(t.text for t in of_type(frames, Token)) == "".join(WORDS[:3])
    (done,) = of_type(frames, Done)
    assert frames[-1] is done and done.reason is FinishReason.STOP
    assert (slots.running, slots.queued) == (0, 0)


async def test_a_push_out_while_queued_is_being_sent_ends_the_run_overloaded() -> None:
    engine = ScriptedEngine(lambda request: Script(WORDS))
    slots = GenerationSlots(1, 1)
    holder = slots.enqueue("crowd")  # the crowd holds the slot and the queue's one place
    chat = Chat(engine, "s1")
    turn = Turn("hello", SamplingParams(max_new_tokens=64), [])
    prepared = await chat.prepare(turn, max_user_tokens=1024)
    run = GenerationRun("g1", prepared, slots.enqueue("crowd"))
    frames: list[Frame] = []

    async def send(frame: Frame) -> None:
        frames.append(frame)
        if isinstance(frame, Queued):
            slots.enqueue("newcomer")  # under its share: the crowd's queued prompt makes room
        await asyncio.sleep(0)

    await drive(run, chat, slots, send)
    assert [type(f) for f in frames] == [Queued, Error, Done]
    assert frames[1].code is ErrorCode.OVERLOADED  # type: ignore[attr-defined]
    assert engine.requests == []
    slots.release(holder)
