"""A client written from PROTOCOL.md alone (plain websockets + msgpack) against a real uvicorn."""

from __future__ import annotations

import asyncio
import dataclasses

import msgpack
import pytest

from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import generation_threads, raw_peer, running_server, wait_until


def slow_engine(n: int = 200, delay: float = 0.01) -> ScriptedEngine:
    return ScriptedEngine(lambda req: Script([f" t{i}" for i in range(n)], delay_s=delay))


async def test_raw_client_chats_and_token_texts_concat_to_done_text() -> None:
    async with running_server(ScriptedEngine()) as url, raw_peer(url) as (peer, ready):
        assert ready["v"] == 1 and ready["capabilities"] == {"images": False, "max_images": 0}
        await peer.send({"type": "prompt", "id": "a", "text": "hello"})
        frames = await peer.recv_until("done")
        assert frames[0]["type"] == "start"
        tokens = [f for f in frames if f["type"] == "token"]
        indexes = [t["index"] for t in tokens]
        assert indexes == sorted(set(indexes)) and indexes[-1] == 8  # merged frames jump
        assert "".join(t["text"] for t in tokens) == frames[-1]["text"]
        assert frames[-1]["reason"] == "stop"


async def test_raw_client_cancels_mid_stream_and_gets_one_done() -> None:
    async with running_server(slow_engine()) as url, raw_peer(url) as (peer, _):
        await peer.send({"type": "prompt", "id": "a", "text": "go"})
        await peer.recv_until("token")
        await peer.send({"type": "cancel", "id": "a"})
        frames = await peer.recv_until("done")
        assert frames[-1]["reason"] == "cancelled"
        await peer.send({"type": "ping", "t": "after"})
        assert await peer.recv() == {"type": "pong", "t": "after"}


async def test_raw_client_reset_mid_stream_orders_done_before_reset_ok() -> None:
    async with running_server(slow_engine()) as url, raw_peer(url) as (peer, _):
        await peer.send({"type": "prompt", "id": "a", "text": "go"})
        await peer.recv_until("token")
        await peer.send({"type": "reset"})
        frames = await peer.recv_until("reset_ok")
        kinds = [f["type"] for f in frames]
        assert kinds.index("done") < kinds.index("reset_ok")


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (b"\xc1", "bad_frame"),
        (msgpack.packb([1, 2]), "bad_frame"),
        (msgpack.packb({"type": "nope"}), "bad_frame"),
        (msgpack.packb({"type": "prompt", "id": "a"}), "bad_frame"),
        (msgpack.packb({"type": "prompt", "id": "", "text": "x"}), "bad_frame"),
        (
            msgpack.packb({"type": "prompt", "id": "a", "text": "x", "params": {"temp": 1}}),
            "invalid_params",
        ),
        (
            msgpack.packb(
                {"type": "prompt", "id": "a", "text": "x", "params": {"max_new_tokens": True}}
            ),
            "invalid_params",
        ),
        (
            msgpack.packb(
                {"type": "prompt", "id": "a", "text": "x", "params": {"top_p": float("inf")}}
            ),
            "invalid_params",
        ),
        (msgpack.packb({"type": "image", "id": "i", "data": b"\x89PNG"}), "unsupported"),
        (msgpack.packb({"type": "cancel", "id": "never"}), "not_running"),
        (msgpack.packb({"type": "ping"}) + b"\x00", "bad_frame"),
    ],
)
async def test_bad_frames_get_their_error_code_and_the_session_goes_on(
    payload: bytes, code: str
) -> None:
    async with running_server(ScriptedEngine()) as url, raw_peer(url) as (peer, _):
        await peer.ws.send(payload)
        error = await peer.recv()
        assert (error["type"], error["code"]) == ("error", code)
        await peer.send({"type": "prompt", "id": "ok", "text": "still here"})
        assert (await peer.recv_until("done"))[-1]["reason"] == "stop"


async def test_text_message_is_bad_frame() -> None:
    async with running_server(ScriptedEngine()) as url, raw_peer(url) as (peer, _):
        await peer.ws.send("not binary")
        error = await peer.recv()
        assert error["code"] == "bad_frame"
        assert error["message"] == "text messages are not frames: send msgpack as binary"


async def test_disconnect_mid_generation_leaves_no_generation_thread() -> None:
    engine = slow_engine(n=10_000, delay=0.005)
    async with running_server(engine) as url:
        async with raw_peer(url) as (peer, _):
            await peer.send({"type": "prompt", "id": "a", "text": "go"})
            await peer.recv_until("token")
            assert generation_threads()
        await wait_until(lambda: not generation_threads())
        assert engine.threads == set()


async def test_resume_token_restores_the_conversation() -> None:
    engine = ScriptedEngine()
    async with running_server(engine) as url:
        async with raw_peer(url) as (peer, ready):
            await peer.send({"type": "prompt", "id": "a", "text": "remember me"})
            await peer.recv_until("done")
        async with raw_peer(f"{url}?resume={ready['resume']}") as (peer2, ready2):
            assert ready2["session"] == ready["session"]
            await peer2.send({"type": "prompt", "id": "b", "text": "again"})
            await peer2.recv_until("done")
        first, second = engine.requests
        assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids


async def test_healthz_and_readyz_answer() -> None:
    import httpx

    async with running_server(ScriptedEngine()) as url:
        base = url.replace("ws://", "http://").removesuffix("/v1/chat")
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(f"{base}/healthz")).status_code == 200
            ready = (await http.get(f"{base}/readyz")).json()
        assert ready["ready"] is True and ready["engine"] == "scripted"
    await asyncio.sleep(0)


async def test_ready_says_what_the_model_can_do_where_the_server_knows() -> None:
    engine = ScriptedEngine()
    engine.info = dataclasses.replace(engine.info, about="A scripted model: replies are fixed.")
    async with running_server(engine) as url, raw_peer(url) as (_, ready):
        assert ready["about"] == "A scripted model: replies are fixed."
    async with running_server(ScriptedEngine()) as url, raw_peer(url) as (_, ready):
        assert "about" not in ready
