"""Load on a wschat server over its WebSocket (plain websockets + msgpack, as PROTOCOL.md says):
concurrent streams, a long conversation, cancels, idle sessions."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgpack
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.typing import Subprotocol

from .stats import StreamTimes

TIMEOUT = 300.0


class Peer:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.ready: dict[str, Any] = {}  # the session's ready frame, once received

    async def send(self, frame: dict[str, Any]) -> None:
        await self.ws.send(msgpack.packb(frame, use_bin_type=True))

    async def recv(self) -> dict[str, Any]:
        async with asyncio.timeout(TIMEOUT):
            data = await self.ws.recv()
        frame: dict[str, Any] = msgpack.unpackb(data, raw=False)
        if frame["type"] == "error":
            raise RuntimeError(f"server error: {frame}")
        return frame


@contextlib.asynccontextmanager
async def session(url: str) -> AsyncIterator[Peer]:
    async with asyncio.timeout(TIMEOUT):
        ws = await websockets.connect(url, subprotocols=[Subprotocol("wschat.v1")], max_queue=None)
    try:
        peer = Peer(ws)
        peer.ready = await peer.recv()
        assert peer.ready["type"] == "ready", peer.ready
        yield peer
    finally:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(10):
                await ws.close()


async def stream(
    peer: Peer,
    text: str,
    max_new_tokens: int,
    frame_id: str = "p",
    images: Sequence[bytes] = (),
    sampled: bool = False,
) -> tuple[StreamTimes, dict[str, Any]]:
    """One prompt: a timestamp per generated token (a merged frame stamps all of its tokens);
    the frames' facts: ``start``'s fields, when it came (``start_at``), the places ``queued``
    frames gave (``positions``, none when a slot was free) and ``done``. ``images`` go with the
    prompt (encoded files). Greedy, or ``sampled`` with the server's default sampling."""
    params: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    if not sampled:
        params["temperature"] = 0
    times = StreamTimes(time.perf_counter(), [])
    prompt = {"type": "prompt", "id": frame_id, "text": text, "params": params}
    await peer.send({**prompt, "images": list(images)} if images else prompt)
    seen, start, positions = 0, {}, []
    while True:
        frame = await peer.recv()
        if frame["type"] == "queued":
            positions.append(frame["position"])
        elif frame["type"] == "start":
            start = {**frame, "start_at": time.perf_counter(), "positions": positions}
        elif frame["type"] == "token":
            now = time.perf_counter()
            times.tokens.extend([now] * (frame["index"] - seen))
            seen = frame["index"]
        elif frame["type"] == "done":
            return times, {**start, "done": frame}


async def served(
    url: str, texts: list[str], max_new_tokens: int, sampled: bool = False
) -> list[tuple[StreamTimes, dict[str, Any]]]:
    """One fresh session per text, all prompts sent at once once every session is ready; each
    stream with its frames' facts (``stream``)."""
    async with contextlib.AsyncExitStack() as stack:
        peers = [await stack.enter_async_context(session(url)) for _ in texts]
        return list(
            await asyncio.gather(
                *(
                    stream(p, t, max_new_tokens, sampled=sampled)
                    for p, t in zip(peers, texts, strict=True)
                )
            )
        )


async def concurrent(
    url: str, texts: list[str], max_new_tokens: int, sampled: bool = False
) -> list[StreamTimes]:
    """``served``'s streams alone (greedy, or with the server's default sampling)."""
    return [times for times, _ in await served(url, texts, max_new_tokens, sampled)]


async def conversation(url: str, turns: list[str], max_new_tokens: int) -> list[dict[str, Any]]:
    """One session, turn after turn: each turn's TTFT, prompt and cached tokens."""
    out = []
    async with session(url) as peer:
        for i, text in enumerate(turns):
            times, frames = await stream(peer, text, max_new_tokens, frame_id=f"t{i}")
            out.append(
                {
                    "ttft": times.ttft,
                    "prompt_tokens": frames["prompt_tokens"],
                    "cached_tokens": frames["cached_tokens"],
                    "completion_tokens": frames["done"]["usage"]["completion_tokens"],
                }
            )
    return out


async def cancelled_mid_stream(
    peer: Peer, frame_id: str, text: str, max_new_tokens: int, after_tokens: int
) -> tuple[float, float]:
    """A greedy reply to ``text`` cancelled once its token ``after_tokens`` came: when the
    cancel went (``time.perf_counter``) and the seconds from then to its ``done``."""
    params = {"max_new_tokens": max_new_tokens, "temperature": 0}
    await peer.send({"type": "prompt", "id": frame_id, "text": text, "params": params})
    while (frame := await peer.recv())["type"] != "token" or frame["index"] < after_tokens:
        pass
    sent = time.perf_counter()
    await peer.send({"type": "cancel", "id": frame_id})
    while (await peer.recv())["type"] != "done":
        pass
    return sent, time.perf_counter() - sent


async def reset(peer: Peer, frame_id: str) -> None:
    """Empty the session's history (so the next prompt stays short)."""
    await peer.send({"type": "reset", "id": frame_id})
    while (await peer.recv())["type"] != "reset_ok":
        pass


async def cancels(url: str, text: str, count: int, after_tokens: int = 4) -> list[float]:
    """Seconds from sending ``cancel`` mid-stream to receiving ``done``, ``count`` times."""
    waits = []
    async with session(url) as peer:
        for i in range(count):
            _, done_s = await cancelled_mid_stream(peer, f"c{i}", text, 1000, after_tokens)
            waits.append(done_s)
            await reset(peer, f"r{i}")
    return waits


@contextlib.asynccontextmanager
async def idle_sessions(url: str, count: int) -> AsyncIterator[int]:
    """``count`` connected sessions (each got its ``ready``), held open while in the block."""
    async with contextlib.AsyncExitStack() as stack:
        for start in range(0, count, 50):
            batch = [session(url) for _ in range(min(50, count - start))]
            await asyncio.gather(*(stack.enter_async_context(s) for s in batch))
        yield count
