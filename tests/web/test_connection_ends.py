"""How a ``Connection`` ends, and what is sent around it: the peer going away mid-reply, an idle
connection closed, a frame the session code fails on. A real server, real peers."""

from __future__ import annotations

import logging

import pytest
import websockets

from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import TIMEOUT, raw_peer, running_server, zombie_peer


def slow_reply(tokens: int = 200) -> ScriptedEngine:
    """An engine whose replies take a while: a token every 10 ms."""
    return ScriptedEngine(lambda req: Script([f" w{i}" for i in range(tokens)], delay_s=0.01))


async def test_a_peer_gone_mid_reply_leaves_the_server_serving_and_nothing_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="wschat")
    engine = slow_reply()
    async with running_server(engine, resume_window_s=0.0) as url:  # no resume: cancelled
        async with zombie_peer(url) as gone:
            await gone.send({"type": "prompt", "id": "p1", "text": "hi"})
            await gone.recv_until("token")
            # the peer goes: its socket is dropped without a close frame, mid-reply
        async with raw_peer(url) as (peer, _):
            await peer.send({"type": "prompt", "id": "p2", "text": "hi", "params": {}})
            frames = await peer.recv_until("done")
        assert frames[-1]["reason"] in ("length", "stop")
        assert "".join(f["text"] for f in frames if f["type"] == "token") == frames[-1]["text"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_peer_that_stops_reading_mid_reply_is_dropped_and_its_slot_goes_on() -> None:
    """Its sends block once the buffers are full; after ``send_timeout_s`` the transport is
    dropped, the blocked send fails, the frames after it go nowhere and the reply is cancelled."""
    flood = Script(["x" * 20_000] * 1000, delay_s=0.002, end_with_eos=False)  # 20 MB
    scripts = iter([flood, Script([" ok"])])  # the zombie's prompt comes first
    engine = ScriptedEngine(lambda req: next(scripts))
    async with (
        running_server(engine, max_concurrent=1, send_timeout_s=0.5) as url,
        zombie_peer(url) as zombie,
        raw_peer(url) as (other, _),
    ):
        await zombie.send({"type": "prompt", "id": "z", "text": "flood"})
        await zombie.recv_until("token")  # then it reads no more
        await other.send({"type": "prompt", "id": "o", "text": "hi"})  # waits for the one slot
        frames = await other.recv_until("done")
        assert (frames[-1]["reason"], frames[-1]["text"]) == ("stop", " ok")
        await zombie.wait_closed_by_server()


async def test_an_idle_connection_is_closed_normally_with_idle() -> None:
    async with (
        running_server(ScriptedEngine(), idle_timeout_s=0.3) as url,
        raw_peer(url) as (peer, _),
    ):
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await peer.recv(timeout=TIMEOUT)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1000, "idle")


async def test_a_reply_in_flight_keeps_its_connection_from_being_idle() -> None:
    async with (
        running_server(slow_reply(60), idle_timeout_s=0.3) as url,
        raw_peer(url) as (peer, _),
    ):
        await peer.send({"type": "prompt", "id": "p1", "text": "hi"})
        frames = await peer.recv_until("done")  # 0.6 s of tokens, twice the idle timeout
        assert frames[-1]["reason"] in ("length", "stop")
        assert frames[-1]["usage"]["completion_tokens"] == 60


async def test_without_an_idle_timeout_a_quiet_connection_stays_open() -> None:
    async with (
        running_server(ScriptedEngine(), idle_timeout_s=0.0) as url,
        raw_peer(url) as (peer, _),
    ):
        # nothing to await: quiet is the absence of frames; a close would end the wait early
        with pytest.raises(TimeoutError):
            await peer.recv(timeout=0.5)
        await peer.send({"type": "ping", "t": 1.0})
        assert await peer.recv() == {"type": "pong", "t": 1.0}


class FailingTokenizer(ScriptedEngine):
    """A bug in the engine's code where no engine error is expected: tokenizing "boom"."""

    def tokenize_text(self, text: str) -> list[int]:
        if "boom" in text:
            raise RuntimeError("a bug in the tokenizer")
        return super().tokenize_text(text)


async def test_a_frame_the_session_fails_on_gets_internal_with_its_id_and_the_session_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="wschat")
    async with running_server(FailingTokenizer()) as url, raw_peer(url) as (peer, _):
        await peer.send({"type": "prompt", "id": "p1", "text": "boom"})
        error = await peer.recv()
        assert (error["type"], error["code"], error["id"]) == ("error", "internal", "p1")
        await peer.send({"type": "prompt", "id": "p2", "text": "fine"})
        assert (await peer.recv_until("done"))[-1]["id"] == "p2"
    logged = [r.exc_info[1] for r in caplog.records if r.exc_info]
    assert [str(e) for e in logged] == ["a bug in the tokenizer"]
