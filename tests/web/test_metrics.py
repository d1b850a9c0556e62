"""Rewinds counted (web/metrics.py, web/stats_feed.py): ``/metrics`` has
``wschat_rewinds_total`` by kind and ``/v1/stats`` its ``rewinds`` and ``regenerates``, read
from the same counters. A real server on the scripted engine and a raw peer."""

from __future__ import annotations

import asyncio

import httpx
from websockets.asyncio.client import ClientConnection

from tests.fakes.scripted import ScriptedEngine
from tests.prometheus import samples
from tests.support import (
    TIMEOUT,
    RawPeer,
    http_base,
    next_stats,
    raw_peer,
    running_server,
    stats_socket,
)

REWINDS = "wschat_rewinds_total{kind=rewind}"
REGENERATES = "wschat_rewinds_total{kind=regenerate}"


async def refused(peer: RawPeer, frame: dict[str, object]) -> str:
    await peer.send(frame)
    return str((await peer.recv_until("error"))[-1]["code"])


async def counted(stats: ClientConnection, rewinds: int) -> tuple[int | None, int | None]:
    """``rewinds`` and ``regenerates`` of the first stats frame with ``rewinds`` (one a second,
    a snapshot up to a second old)."""
    async with asyncio.timeout(TIMEOUT):
        while (frame := await next_stats(stats)).rewinds != rewinds:
            pass
    return frame.rewinds, frame.regenerates


async def test_rewinds_and_regenerates_are_counted_in_metrics_and_stats_refusals_not() -> None:
    async with (
        running_server(ScriptedEngine()) as url,
        httpx.AsyncClient(base_url=http_base(url), timeout=TIMEOUT) as http,
        stats_socket(url) as stats,
        raw_peer(url) as (peer, _),
    ):
        first = await next_stats(stats)
        before = samples((await http.get("/metrics")).text)
        for n in (1, 2, 3):
            await peer.send({"type": "prompt", "id": f"p{n}", "text": f"turn {n}"})
            await peer.recv_until("done")
        await peer.send({"type": "rewind", "keep": 2})
        await peer.recv_until("rewound")
        await peer.send({"type": "rewind", "keep": 2})  # keeps what it holds: still a rewind
        await peer.recv_until("rewound")
        await peer.send({"type": "regenerate", "id": "r1"})
        await peer.recv_until("done")
        # refused frames change nothing, so they count nothing
        assert await refused(peer, {"type": "rewind", "keep": 5}) == "invalid_params"
        assert await refused(peer, {"type": "regenerate", "id": "p1"}) == "invalid_params"
        after = samples((await http.get("/metrics")).text)
        later = await counted(stats, 2)
    assert (first.rewinds, first.regenerates) == (0, 0)  # counted from the start, not unknown
    assert (before[REWINDS], before[REGENERATES]) == (0, 0)
    assert (after[REWINDS], after[REGENERATES]) == (2, 1)
    assert later == (2, 1)
