"""Per-connection limits over a real server: sizes, the frame rate, connection caps, idle."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest
import websockets
from wschat.server.engine.local.hf import HFEngine
from wschat.server.engine.local.loader import LoadedModel
from wschat.server.engine.local.options import LocalEngineOptions

from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import TIMEOUT, closed_before_ready, raw_peer, running_server

SMALL: dict[str, Any] = {
    "max_frame_bytes": 4096,
    "max_prompt_bytes": 200,
    "max_prompt_tokens": 150,
    "max_new_tokens": 50,
    "max_images": 2,
}


def words(n: int, delay_s: float = 0.0) -> Any:
    return lambda request: Script([f" w{i}" for i in range(n)], delay_s=delay_s)


async def test_ready_reports_the_configured_limits() -> None:
    overrides: dict[str, Any] = {**SMALL, "frames_per_second": 7, "idle_timeout_s": 33.0}
    async with (
        running_server(ScriptedEngine(context_tokens=512, images=True), **overrides) as url,
        raw_peer(url) as (_, ready),
    ):
        limits = ready["limits"]
    assert {k: limits[k] for k in overrides} == overrides
    assert limits["context_tokens"] == 512


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ({"type": "prompt", "id": "a", "text": "x" * 3000}, "too_large"),  # frame > 4096 bytes
        ({"type": "prompt", "id": "a", "text": "é" * 101}, "too_large"),  # 202 bytes > 200
        ({"type": "prompt", "id": "a", "text": "x" * 180}, "too_large"),  # 180 tokens > 150
        ({"type": "prompt", "id": "a", "text": "x" * 140}, "context_overflow"),  # context 128
        (
            {"type": "prompt", "id": "a", "text": "x", "params": {"max_new_tokens": 51}},
            "invalid_params",
        ),
        (
            {"type": "prompt", "id": "a", "text": "x", "params": {"max_new_tokens": 0}},
            "invalid_params",
        ),
        (
            {"type": "prompt", "id": "a", "text": "x", "params": {"temperature": float("nan")}},
            "invalid_params",
        ),
        (
            {"type": "prompt", "id": "a", "text": "x", "params": {"temperature": -1.0}},
            "invalid_params",
        ),
        ({"type": "prompt", "id": "a", "text": True}, "bad_frame"),
        ({"type": "prompt", "id": "a" * 65, "text": "x"}, "bad_frame"),
        ({"type": "prompt", "id": 7, "text": "x"}, "bad_frame"),
        ({"type": "prompt", "id": "a", "text": "x", "images": [b"1", b"2", b"3"]}, "too_large"),
        ({"type": "configure", "system": 5}, "invalid_params"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
async def test_a_frame_over_a_limit_or_with_a_bad_field_gets_its_code_and_the_session_goes_on(
    frame: dict[str, Any], code: str
) -> None:
    engine = ScriptedEngine(context_tokens=128, images=True, max_images=2)
    async with running_server(engine, **SMALL) as url, raw_peer(url) as (peer, _):
        await peer.send(frame)
        error = await peer.recv()
        assert (error["type"], error["code"]) == ("error", code), error
        await peer.send({"type": "prompt", "id": "ok", "text": "still here"})
        assert (await peer.recv_until("done"))[-1]["reason"] == "stop"
    assert engine.requests[-1].prompt_ids, "the good prompt reached the engine"
    assert len(engine.requests) == 1, "no refused prompt reached the engine"


async def test_invalid_utf8_in_a_string_is_a_bad_frame() -> None:
    raw = msgpack.packb({"type": "prompt", "id": "a", "text": "PLACEHOLDER"})
    raw = raw.replace(b"PLACEHOLDER", b"\xff\xfe\xfdLACEHOLDER")
    async with running_server(ScriptedEngine()) as url, raw_peer(url) as (peer, _):
        await peer.ws.send(raw)
        error = await peer.recv()
        assert (error["type"], error["code"]) == ("error", "bad_frame")


async def test_a_tiny_frame_cannot_expand_into_a_huge_object() -> None:
    # a 10-byte frame whose header claims a 2**31-element array: refused before any allocation
    bomb = b"\x81\xa4type\xdd\x7f\xff\xff\xff"
    async with running_server(ScriptedEngine()) as url, raw_peer(url) as (peer, _):
        await peer.ws.send(bomb)
        error = await peer.recv()
        assert (error["type"], error["code"]) == ("error", "too_large")
        await peer.send({"type": "ping", "t": 1.0})
        assert (await peer.recv())["type"] == "pong"


async def test_max_new_tokens_is_capped_by_what_the_context_leaves(
    tiny_text_loaded: LoadedModel,
) -> None:
    engine = HFEngine(tiny_text_loaded, LocalEngineOptions(context_tokens=40))
    try:
        async with running_server(engine) as url, raw_peer(url) as (peer, _):
            await peer.send(
                {
                    "type": "prompt",
                    "id": "a",
                    "text": "one two three",
                    "params": {"max_new_tokens": 500},
                }
            )
            done = (await peer.recv_until("done"))[-1]
        usage = done["usage"]
        assert done["reason"] == "length"
        assert usage["prompt_tokens"] + usage["completion_tokens"] <= 40
        assert usage["completion_tokens"] >= 1
    finally:
        await engine.aclose()


async def test_a_frame_flood_gets_overloaded_then_close_1008() -> None:
    async with running_server(ScriptedEngine(), frames_per_second=10) as url:
        async with raw_peer(url) as (peer, _):
            for i in range(11):
                await peer.send({"type": "ping", "t": float(i)})
            frames = []
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    frames.append(await peer.recv())
        assert [f["type"] for f in frames] == ["pong"] * 10 + ["error"]
        assert frames[-1]["code"] == "overloaded"
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1008
        async with raw_peer(url) as (peer, _):  # the server itself is fine
            await peer.send({"type": "ping", "t": 0.0})
            assert (await peer.recv())["type"] == "pong"


async def test_frames_within_the_rate_are_never_refused() -> None:
    async with (
        running_server(ScriptedEngine(), frames_per_second=20) as url,
        raw_peer(url) as (peer, _),
    ):
        for burst in range(2):
            for j in range(20):
                await peer.send({"type": "ping", "t": float(j)})
            assert [(await peer.recv())["type"] for _ in range(20)] == ["pong"] * 20
            if burst == 0:
                await asyncio.sleep(1.05)  # the one-second window is the rule under test


async def test_connections_over_the_total_cap_are_closed_1013_with_a_reason() -> None:
    async with running_server(ScriptedEngine(), max_connections=2) as url:
        async with raw_peer(url), raw_peer(url):
            code, reason = await closed_before_ready(url)
            assert (code, reason) == (1013, "the server is full (2 connections)")
        async with raw_peer(url) as (peer, _):  # a freed place is usable again
            await peer.send({"type": "ping", "t": 0.0})
            assert (await peer.recv())["type"] == "pong"


async def test_connections_over_the_per_address_cap_are_closed_but_other_addresses_get_in() -> None:
    async with (
        running_server(ScriptedEngine(), max_connections_per_client=2) as url,
        raw_peer(url),
        raw_peer(url),
    ):
        code, reason = await closed_before_ready(url)
        assert code == 1013
        assert reason == "too many connections from this address (2)"
        async with raw_peer(url, local_addr=("127.0.0.2", 0)) as (peer, _):
            await peer.send({"type": "ping", "t": 0.0})
            assert (await peer.recv())["type"] == "pong"


async def test_an_idle_connection_is_closed_1000_but_never_during_a_generation() -> None:
    engine = ScriptedEngine(words(12, delay_s=0.1))  # ~1.2 s of generation: over the timeout
    async with running_server(engine, idle_timeout_s=0.6) as url:
        async with raw_peer(url) as (peer, _):
            await peer.send({"type": "prompt", "id": "a", "text": "go"})
            done = (await peer.recv_until("done"))[-1]
            assert done["reason"] == "stop"
            assert done["text"] == "".join(f" w{i}" for i in range(12))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await peer.recv(timeout=TIMEOUT)
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1000, "idle")
