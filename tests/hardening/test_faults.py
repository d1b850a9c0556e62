"""Faults over a real server: each becomes an ``error`` frame with a generic message, and the
session (and the server) goes on; a peer that vanishes or stops answering pings frees its slot."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import wschat.server.sessions.images
from wschat.server.engine import Generation, GenerationRequest
from wschat.server.engine.history import Conversation

from tests.fakes.scripted import Script, ScriptedEngine
from tests.prometheus import samples
from tests.support import (
    TIMEOUT,
    generation_threads,
    http_base,
    next_stats,
    raw_peer,
    running_server,
    stats_socket,
    wait_until,
)

SECRET = "/srv/internal/path secret-detail"


def script(request: GenerationRequest) -> Script:
    """A capital letter in the prompt picks the behaviour (one scripted id per character)."""
    behaviours = {
        "F": Script([" a", " b", " c", " d"], fail_after=2),
        "S": Script([" a", " b", " c"], stall_after=1),
        "L": Script([f" t{i}" for i in range(20_000)], delay_s=0.01),
    }
    for letter, behaviour in behaviours.items():
        if 300 + ord(letter) in request.prompt_ids:
            return behaviour
    return Script([" fine"])


async def still_chats(peer: Any, frame_id: str = "next") -> None:
    await peer.send({"type": "prompt", "id": frame_id, "text": "ok"})
    done = (await peer.recv_until("done"))[-1]
    assert (done["reason"], done["text"]) == ("stop", " fine")


def assert_generic(error: dict[str, Any]) -> None:
    assert error["code"] == "internal"
    assert SECRET not in error["message"]
    assert "Traceback" not in error["message"] and "Error" not in error["message"]


async def test_an_exception_in_the_generation_thread_is_an_internal_error_then_done() -> None:
    async with running_server(ScriptedEngine(script)) as url, raw_peer(url) as (peer, _):
        await peer.send({"type": "prompt", "id": "a", "text": "F"})
        frames = await peer.recv_until("done")
        kinds = [f["type"] for f in frames]
        # the two tokens before the failure may come merged into one frame
        assert kinds[0] == "start" and kinds[-2:] == ["error", "done"]
        assert set(kinds[1:-2]) == {"token"}
        assert "".join(f["text"] for f in frames if f["type"] == "token") == " a b"
        assert_generic(frames[-2])
        assert frames[-2]["id"] == "a"
        assert (frames[-1]["reason"], frames[-1]["text"]) == ("error", " a b")
        await still_chats(peer)


class FailingStart(ScriptedEngine):
    """Starting a prompt with an ``X`` raises, as an id past int64 from a restored state did."""

    def generate(self, request: GenerationRequest) -> Generation:
        if 300 + ord("X") in request.prompt_ids:
            raise OverflowError(SECRET)
        return super().generate(request)


async def test_a_generation_whose_start_raises_gets_an_internal_error_then_done() -> None:
    async with (
        running_server(FailingStart(script), max_concurrent=1) as url,
        raw_peer(url) as (peer, _),
    ):
        await peer.send({"type": "prompt", "id": "a", "text": "X"})
        frames = await peer.recv_until("done")
        assert [f["type"] for f in frames[-2:]] == ["error", "done"]
        assert_generic(frames[-2])
        assert frames[-2]["id"] == "a" and frames[-1]["reason"] == "error"
        await still_chats(peer)  # max_concurrent=1: the slot was freed


async def test_a_stalled_generation_is_cancelled_with_an_error_and_frees_its_slot() -> None:
    engine = ScriptedEngine(script)
    async with (
        running_server(engine, stall_timeout_s=0.5, max_concurrent=1) as url,
        raw_peer(url) as (peer, _),
    ):
        await peer.send({"type": "prompt", "id": "a", "text": "S"})
        frames = await peer.recv_until("done")
        errors = [f for f in frames if f["type"] == "error"]
        assert len(errors) == 1
        assert_generic(errors[0])
        assert "no progress" in errors[0]["message"]
        assert (frames[-1]["reason"], frames[-1]["text"]) == ("error", " a")
        await still_chats(peer)  # max_concurrent=1: it would queue forever if the slot leaked
        engine.unstall()


async def test_failed_and_stalled_generations_are_counted_as_internal_errors() -> None:
    engine = ScriptedEngine(script)
    async with (
        running_server(engine, stall_timeout_s=0.5) as url,
        raw_peer(url) as (peer, _),
        stats_socket(url) as ws,
        httpx.AsyncClient(timeout=TIMEOUT) as http,
    ):
        counted: list[float] = []
        for frame_id, text in (("failed", "F"), ("stalled", "S")):
            await peer.send({"type": "prompt", "id": frame_id, "text": text})
            errors = [f for f in await peer.recv_until("done") if f["type"] == "error"]
            assert [(e["code"], e["id"]) for e in errors] == [("internal", frame_id)]
            metrics = samples((await http.get(http_base(url) + "/metrics")).text)
            counted.append(metrics["wschat_errors_total{code=internal}"])
        engine.unstall()
        assert counted == [1, 2]
        async with asyncio.timeout(TIMEOUT):
            while (stats := await next_stats(ws)).errors != {"internal": 2}:
                assert set(stats.errors) <= {"internal"}


async def test_an_exception_in_session_code_is_an_internal_error_without_details(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = Conversation.prompt_ids
    calls = 0

    def fail_once(self: Conversation, *args: Any, **kwargs: Any) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise KeyError(SECRET)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Conversation, "prompt_ids", fail_once)
    async with running_server(ScriptedEngine(script)) as url, raw_peer(url) as (peer, _):
        await peer.send({"type": "prompt", "id": "a", "text": "hello"})
        error = await peer.recv()
        assert error["type"] == "error" and error["id"] == "a"
        assert_generic(error)
        await still_chats(peer)


async def test_an_exception_while_decoding_an_image_is_an_internal_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def explode(data: bytes, limits: object) -> object:
        raise MemoryError(SECRET)

    monkeypatch.setattr(wschat.server.sessions.images, "check_image", explode)
    engine = ScriptedEngine(script, images=True)
    async with running_server(engine) as url, raw_peer(url) as (peer, _):
        await peer.send({"type": "image", "id": "i", "data": b"\x89PNG\r\n\x1a\n...."})
        error = await peer.recv()
        assert error["type"] == "error" and error["id"] == "i"
        assert_generic(error)
        await still_chats(peer)


async def test_a_peer_that_stops_answering_pings_has_its_generation_cancelled() -> None:
    engine = ScriptedEngine(script)
    async with running_server(engine, ping_interval_s=0.2, max_concurrent=1) as url:
        async with raw_peer(url) as (silent, _):
            await silent.send({"type": "prompt", "id": "a", "text": "L"})
            await silent.recv_until("token")
            silent.ws.transport.pause_reading()  # reads nothing more: no pongs either
            await wait_until(lambda: not generation_threads())
            silent.ws.transport.resume_reading()
        async with raw_peer(url) as (peer, _):
            await peer.send({"type": "prompt", "id": "b", "text": "ok"})
            first = await peer.recv()
            assert first["type"] == "start", "the slot of the silent peer was not freed"
            async with asyncio.timeout(TIMEOUT):
                assert (await peer.recv_until("done"))[-1]["reason"] == "stop"
