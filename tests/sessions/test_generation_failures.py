"""A reply that fails partway: the tokens already sent stay sent, the engine's own words (an
``EngineError``) reach the peer with their code, its detail never does, and exactly one ``done``
ends the reply; a token the peer cannot take, a task cancelled mid-reply and a queued prompt
pushed out each end the same way. A real server and a raw peer, or a run and its ``send``."""

from __future__ import annotations

import asyncio

import pytest
from wschat.protocol import Done, Error, ErrorCode, FinishReason, Frame, Queued, Start, Token
from wschat.server.engine import Chat, SamplingParams, Turn
from wschat.server.engine.base import Finished, Generation, LoopBridge, TokenPiece
from wschat.server.engine.errors import EngineFailed, EngineOverloaded, GenerationFailure
from wschat.server.sessions.generation import GenerationRun
from wschat.server.sessions.slots import GenerationSlots, Ticket

from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import TIMEOUT, raw_peer, running_server

DETAIL = "slot 3 of 4 wedged at step 17"  # for the log, never the peer


class FailsMidReply(ScriptedEngine):
    """Two tokens, then the end of the reply in error with ``error``."""

    def __init__(self, error: GenerationFailure) -> None:
        super().__init__()
        self.error = error

    def _run(self, script: Script, generation: Generation, bridge: LoopBridge) -> None:
        bridge.put(TokenPiece(" two", (1000,)))
        bridge.put(TokenPiece(" words", (1001,)))
        bridge.put(Finished(FinishReason.ERROR, (1000, 1001), self.error))


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (EngineOverloaded.retry_in("the engine is full", 2.0, detail=DETAIL), "overloaded"),
        (EngineFailed("the engine stopped", detail=DETAIL), "internal"),
    ],
)
async def test_an_engine_failure_mid_reply_sends_its_words_and_code_then_one_done(
    error: GenerationFailure, code: str
) -> None:
    async with running_server(FailsMidReply(error)) as url, raw_peer(url) as (peer, _):
        await peer.send({"type": "prompt", "id": "p1", "text": "hi"})
        frames = await peer.recv_until("done")
        await peer.send({"type": "ping", "t": 1.0})  # nothing else of the reply follows
        assert await peer.recv() == {"type": "pong", "t": 1.0}
    kinds = [f["type"] for f in frames]
    assert kinds[0] == "start" and kinds[-2:] == ["error", "done"] and kinds.count("done") == 1
    text = "".join(f["text"] for f in frames if f["type"] == "token")
    assert text == " two words"
    failed, done = frames[-2], frames[-1]
    assert (failed["code"], failed["message"], failed["id"]) == (code, error.message, "p1")
    assert DETAIL not in str(frames)
    assert (done["reason"], done["text"]) == ("error", " two words")
    assert done["usage"]["completion_tokens"] == 2


async def run_on(engine: ScriptedEngine, ticket: Ticket) -> tuple[GenerationRun, Chat]:
    chat = Chat(engine, "s1")
    turn = Turn("hello", SamplingParams(max_new_tokens=200), [])
    prepared = await chat.prepare(turn, max_user_tokens=1024)
    return GenerationRun("g1", prepared, ticket), chat


class Peer:
    """A run's ``send``: keeps the frames, can refuse tokens (a peer gone mid-send), and wakes
    a waiter on the first frame of a kind."""

    def __init__(self, refuse_tokens: bool = False) -> None:
        self.frames: list[Frame] = []
        self.refuse_tokens = refuse_tokens
        self.seen: dict[type, asyncio.Event] = {Queued: asyncio.Event(), Token: asyncio.Event()}

    async def send(self, frame: Frame) -> None:
        if isinstance(frame, Token) and self.refuse_tokens:
            raise ConnectionResetError("the peer went away")
        self.frames.append(frame)
        if type(frame) in self.seen:
            self.seen[type(frame)].set()

    async def first(self, kind: type) -> None:
        async with asyncio.timeout(TIMEOUT):
            await self.seen[kind].wait()


def long_reply() -> ScriptedEngine:
    return ScriptedEngine(lambda req: Script([f" w{i}" for i in range(200)], delay_s=0.005))


async def test_a_token_the_peer_cannot_take_cancels_the_generation_then_error_and_done() -> None:
    slots, peer = GenerationSlots(1, 4), Peer(refuse_tokens=True)
    run, chat = await run_on(long_reply(), slots.enqueue())
    async with asyncio.timeout(TIMEOUT):
        await run.drive(chat, slots, peer.send)  # the failure is told, not raised
    assert [type(f) for f in peer.frames] == [Start, Error, Done]
    error, done = peer.frames[1:]
    assert isinstance(error, Error) and (error.code, error.id) == (ErrorCode.INTERNAL, "g1")
    assert isinstance(done, Done) and done.reason is FinishReason.ERROR
    assert run.generation is not None and run.generation.cancel_flag.is_set()
    assert slots.running == 0


async def test_a_run_cancelled_mid_reply_cancels_its_generation_frees_its_slot_and_sends_done() -> (
    None
):
    slots, peer = GenerationSlots(1, 4), Peer()
    run, chat = await run_on(long_reply(), slots.enqueue())
    task = asyncio.create_task(run.drive(chat, slots, peer.send))
    await peer.first(Token)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(TIMEOUT):
            await task
    assert run.generation is not None and run.generation.cancel_flag.is_set()
    assert slots.running == 0
    done = peer.frames[-1]
    assert isinstance(done, Done) and done.reason is FinishReason.ERROR


async def test_a_queued_prompt_pushed_out_for_another_address_gets_overloaded_then_done() -> None:
    slots, peer = GenerationSlots(1, 1), Peer()
    hog = slots.enqueue("10.0.0.1")  # the one slot
    run, chat = await run_on(ScriptedEngine(), slots.enqueue("10.0.0.1"))
    task = asyncio.create_task(run.drive(chat, slots, peer.send))
    await peer.first(Queued)
    slots.enqueue("10.0.0.2")  # the queue is full, and the first address holds all of it
    async with asyncio.timeout(TIMEOUT):
        await task
    assert [type(f) for f in peer.frames] == [Queued, Error, Done]
    error, done = peer.frames[1:]
    assert isinstance(error, Error) and (error.code, error.id) == (ErrorCode.OVERLOADED, "g1")
    assert isinstance(done, Done) and done.reason is FinishReason.ERROR
    assert run.generation is None and slots.running == 1
    slots.release(hog)
