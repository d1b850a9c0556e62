"""The Responses API's WebSocket mode (``--only responses``): streams through the official
``openai`` SDK's ``responses.connect()`` against our msgpack WebSocket on the same server, and a
conversation continued by ``previous_response_id`` on one socket.

Streams: in each round, N streams (1 and 8) of greedy prompts go once over the msgpack WebSocket
(bench/wsload.py), once through the SDK's WebSocket mode and once through a raw client of the
mode (``raw_streams``: websockets and ``json.loads``, as wsload is websockets and msgpack), a
socket each, opened before the round's creates are sent at once (as wsload opens its sessions
first), back to back, the order turning from round to round; the prompts are alike but each one
new. The mode's tokens are counted from ``usage.output_tokens`` and stamped by
``response.output_text.delta``, as the WebSocket's by frame. Per concurrency: the medians over
rounds, and the median of each round's ratio to the msgpack WebSocket's (bench/openai_api.py's
rules; the SDK's are the targets).

The raw client puts the mode's server path beside the msgpack WebSocket with a client of about
the same cost; the SDK's ratio adds the SDK's own: it validates each event into its pydantic
types (about 0.2 ms of CPU an event, the first of each type in a process far more: the warm-up
takes that), on the cores the server decodes on. Each API's client CPU time per round (this
process's) says how much that is.

Conversation: ``turns`` turns of CONVERSATION on one socket through the SDK, each
``response.create`` its new input and the ``previous_response_id`` it continues (``store:
false``); per turn the TTFT, ``usage.input_tokens`` and ``input_tokens_details.cached_tokens``,
``conversations`` times, the median per turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection

from . import procs, wsload
from .figures import Column, Section, Target, at_least
from .openai_api import (
    LABELS,
    RATIOS,
    OpenAIWork,
    Streamer,
    conversation_targets,
    merged_tokens,
    paired_rounds,
    round_ratio,
    stream_table,
)
from .render import figure
from .stats import StreamTimes, median
from .workload import CONVERSATION

log = logging.getLogger("bench.responses")

TIMEOUT = 300.0
# the mode through the SDK (the targets') and through a raw client, each held to the WebSocket
APIS = ("responses-ws", "responses-raw")
ENDS = ("response.completed", "response.incomplete", "response.failed", "error")


# the chat API scenario's work (bench/openai_api.py), so the two scenarios read alike
ResponsesWork = OpenAIWork


def available() -> str | None:
    try:
        import openai  # noqa: F401
        import websockets  # noqa: F401
    except ImportError:
        return "the openai package or websockets is missing (pip install 'openai[realtime]')"
    return None


def run(work: ResponsesWork, logs: Path, engine: str = "batched") -> dict[str, Any]:
    logs.mkdir(parents=True, exist_ok=True)
    with procs.wschat(engine, logs, sessions=64, name="wschat-responses") as server:
        figures = asyncio.run(measure(server.ws_url, work))
    return {"workload": dataclasses.asdict(work), "engine": engine, **figures}


async def measure(url: str, work: ResponsesWork) -> dict[str, Any]:
    import openai

    logging.getLogger("openai").setLevel(logging.WARNING)
    base = url.replace("ws://", "http://").removesuffix("/v1/chat") + "/v1"
    async with openai.AsyncOpenAI(base_url=base, api_key="-", timeout=TIMEOUT) as client:
        streamers: dict[str, Streamer] = {
            "websocket": lambda texts, n: wsload.concurrent(url, texts, n),
            "responses-ws": lambda texts, n: socket_streams(client, texts, n),
            "responses-raw": lambda texts, n: raw_streams(url, texts, n),
        }
        figures = await paired_rounds(streamers, work)
        log.info("%d turns on one socket, %d times", work.turns, work.conversations)
        runs = [await conversation(client, work) for _ in range(work.conversations)]
    ws = figures["websocket"]
    ratios = {
        api: {n: {k: round_ratio(figures[api][n], ws[n], k) for k in RATIOS} for n in ws}
        for api in APIS
    }
    turns = [
        {key: median([t[key] for t in turn]) for key in turn[0]} for turn in zip(*runs, strict=True)
    ]
    return {"streams": figures, "ratios": ratios, "conversation": turns}


async def socket_streams(client: Any, texts: list[str], tokens: int) -> list[StreamTimes]:
    """One response per text, each on a socket of its own opened first, all sent at once."""
    async with contextlib.AsyncExitStack() as stack:
        sockets = [await stack.enter_async_context(client.responses.connect()) for _ in texts]
        turns = await asyncio.gather(
            *(socket_turn(s, t, tokens) for s, t in zip(sockets, texts, strict=True))
        )
    return [times for times, _ in turns]


async def socket_turn(
    connection: Any, text: str, tokens: int, previous: str | None = None
) -> tuple[StreamTimes, Any]:
    """One ``response.create`` on ``connection``: a delta's tokens stamped when it came; those
    ``usage`` counts beyond the deltas (a merged delta) at the last one. The response, too."""
    times = StreamTimes(time.perf_counter(), [])
    turn = {"previous_response_id": previous} if previous else {}
    await connection.response.create(
        model="embedded", input=text, max_output_tokens=tokens, temperature=0, store=False, **turn
    )
    async with asyncio.timeout(TIMEOUT):
        async for event in connection:
            if event.type == "response.output_text.delta" and event.delta:
                times.tokens.append(time.perf_counter())
            elif event.type in ENDS:
                break
    if event.type == "error" or event.type == "response.failed":
        raise RuntimeError(f"the server answered {event}")
    response = event.response
    finish = "stop" if response.status == "completed" else "length"
    merged_tokens(times, response.usage.output_tokens, finish)
    return times, response


async def raw_streams(url: str, texts: list[str], tokens: int) -> list[StreamTimes]:
    """``socket_streams`` through a raw client: the events read with ``json.loads`` alone."""
    async with contextlib.AsyncExitStack() as stack:
        where = url.replace("/v1/chat", "/v1/responses")
        async with asyncio.timeout(TIMEOUT):
            sockets = [
                await stack.enter_async_context(websockets.connect(where, max_size=None))
                for _ in texts
            ]
        return list(
            await asyncio.gather(
                *(raw_turn(s, t, tokens) for s, t in zip(sockets, texts, strict=True))
            )
        )


async def raw_turn(ws: ClientConnection, text: str, tokens: int) -> StreamTimes:
    """``socket_turn``'s stamps, read off the socket as they came."""
    create = {"type": "response.create", "model": "embedded", "input": text}
    times = StreamTimes(time.perf_counter(), [])
    await ws.send(
        json.dumps({**create, "max_output_tokens": tokens, "temperature": 0, "store": False})
    )
    async with asyncio.timeout(TIMEOUT):
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == "response.output_text.delta" and event["delta"]:
                times.tokens.append(time.perf_counter())
            elif event["type"] in ENDS:
                break
    if event["type"] in ("error", "response.failed"):
        raise RuntimeError(f"the server answered {event}")
    response = event["response"]
    finish = "stop" if response["status"] == "completed" else "length"
    merged_tokens(times, response["usage"]["output_tokens"], finish)
    return times


async def conversation(client: Any, work: ResponsesWork) -> list[dict[str, float]]:
    out = []
    async with client.responses.connect() as connection:
        previous = None
        for text in CONVERSATION[: work.turns]:
            times, response = await socket_turn(connection, text, work.turn_tokens, previous)
            previous = response.id
            usage = response.usage
            out.append(
                {
                    "ttft": times.ttft,
                    "input_tokens": usage.input_tokens,
                    "cached_tokens": usage.input_tokens_details.cached_tokens,
                }
            )
    return out


def targets(result: dict[str, Any]) -> list[Target]:
    """Issue 37: the SDK's WebSocket mode at 0.95 x our msgpack WebSocket's tokens/s or better
    and TTFT at most 1.1 x; turn 10 continued on one socket reads 90 % of its input from cache,
    its TTFT at most 1.3 x turn 1's."""
    rows = []
    streams = result["streams"]
    for n, ws in streams["websocket"].items():
        mode = streams["responses-ws"][n]
        for key, (label, unit) in LABELS.items():
            rows.append(
                Target.judged(
                    f"SDK WebSocket mode {label} at {n} streams vs msgpack WebSocket",
                    value=mode[key],
                    against=ws[key],
                    ratio=result["ratios"]["responses-ws"][n][key],
                    limit=at_least(1 / 1.1 if key == "ttft_median_s" else 0.95),
                    unit=unit,
                )
            )
    how = "continued on one socket"
    return [*rows, *conversation_targets(result["conversation"], how, "input_tokens")]


TABLE = (
    Column("api", 14, left=True),
    Column("streams", 8, "n"),
    Column("tok/s", 10),
    Column("stream tok/s", 14),
    Column("TTFT", 10, "ms"),
    Column("vs msgpack: tok/s, TTFT", 26),
    Column("client CPU", 12, "ms"),
)


def report(result: dict[str, Any]) -> Section:
    work = result["workload"]
    ratios = result["ratios"]
    table = stream_table(TABLE, result["streams"], lambda api, n: ratios.get(api, {}).get(n))
    out = Section(
        [
            f"Responses API WebSocket mode: wschat --engine {result['engine']} on the embedded "
            f"model; {work['tokens']} greedy tokens per stream, {work['rounds']} rounds, our "
            "msgpack WebSocket, the SDK's responses.connect() and a raw client of the mode "
            "back to back",
            table,
            "a conversation continued on one socket (median per turn):",
        ],
        targets(result),
    )
    for i, t in enumerate(result["conversation"], start=1):
        out.parts.append(
            f"  turn {i:>2}: input {t['input_tokens']:>5.0f}, cached {t['cached_tokens']:>5.0f},"
            f" TTFT {figure(t['ttft'], 'ms')}"
        )
    return out
