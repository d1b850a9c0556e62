"""``Connection``: what a peer's bytes become. Bytes that are no frame get an ``error`` and the
session goes on; a flood gets ``overloaded`` and close 1008; every ``error`` sent is counted
where ``/v1/stats`` reads it. A real server, a raw peer."""

from __future__ import annotations

import asyncio

import msgpack
import pytest
import websockets
from websockets.asyncio.client import ClientConnection

from tests.fakes.scripted import ScriptedEngine
from tests.support import TIMEOUT, next_stats, raw_peer, running_server, stats_socket


async def counted_errors(stats: ClientConnection, expected: dict[str, int]) -> dict[str, int]:
    """The ``errors`` of the first stats frame that shows ``expected`` (one a second)."""
    async with asyncio.timeout(TIMEOUT):
        while (errors := dict((await next_stats(stats)).errors)) != expected:
            pass
    return errors


async def test_bytes_that_are_no_frame_get_bad_frame_and_the_session_goes_on() -> None:
    async with (
        running_server(ScriptedEngine()) as url,
        stats_socket(url) as stats,
        raw_peer(url) as (peer, _),
    ):
        await peer.ws.send("a text message")
        await peer.ws.send(b"\xc1")  # never valid msgpack
        await peer.ws.send(msgpack.packb({"text": "no type"}))
        codes = [(await peer.recv())["code"] for _ in range(3)]
        assert codes == ["bad_frame"] * 3
        await peer.send({"type": "ping", "t": 1.0})
        assert (await peer.recv()) == {"type": "pong", "t": 1.0}
        assert await counted_errors(stats, {"bad_frame": 3}) == {"bad_frame": 3}


async def test_a_frame_flood_is_refused_with_overloaded_counted_and_closed_1008() -> None:
    async with (
        running_server(ScriptedEngine(), frames_per_second=5) as url,
        stats_socket(url) as stats,
    ):
        async with raw_peer(url) as (peer, _):
            for i in range(6):
                await peer.send({"type": "ping", "t": float(i)})
            frames = []
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    frames.append(await peer.recv())
        assert [f["type"] for f in frames] == ["pong"] * 5 + ["error"]
        assert frames[-1]["code"] == "overloaded"
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        assert await counted_errors(stats, {"overloaded": 1}) == {"overloaded": 1}


async def test_an_error_raised_by_a_frame_carries_that_frame_s_id() -> None:
    async with running_server(ScriptedEngine()) as url, raw_peer(url) as (peer, _):
        await peer.send({"type": "prompt", "id": "p1", "text": ""})
        error = await peer.recv()
        assert (error["type"], error["code"], error["id"]) == ("error", "invalid_params", "p1")
