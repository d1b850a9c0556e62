"""The OpenAI-compatible API scenario (``--only openai``): streaming through the official
``openai`` SDK against our WebSocket on the same server, and a conversation resent whole.

Streams: in each round, N streams (1 and 8) of greedy prompts go once over the WebSocket
(bench/wsload.py), once through ``AsyncOpenAI`` (``stream=True``) and once through a plain HTTP
client (``_http_stream``: a request written on an open connection, the SSE events read off it,
nothing more), back to back, the order turning from round to round so a shared machine's drift
hits all alike; the prompts are alike but each one new (``unique``). Per concurrency: the
median over rounds of each round's aggregate tokens/s, median stream tokens/s and median TTFT,
and the median over rounds of the round's ratio to the WebSocket's (the SDK's are the targets).
The HTTP APIs' tokens are counted from ``usage`` (``stream_options.include_usage``) and stamped
by chunk, as the WebSocket's by frame.

The plain client puts the server's API path beside its WebSocket with clients of about the same
cost; the SDK's ratio adds the SDK's own. Each API's client CPU time per round (this process's)
says how much that is: the bench's clients share the machine's cores with the server.

Conversation: ``turns`` turns of CONVERSATION through the SDK, each request the whole
conversation so far (as OpenAI clients send it); per turn the TTFT and
``usage.prompt_tokens_details.cached_tokens``, ``conversations`` times, the median per turn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from . import procs, wsload
from .figures import Column, Section, Table, Target, Unit, at_least, at_most
from .render import figure
from .stats import Concurrent, StreamTimes, median
from .workload import CONVERSATION, story

log = logging.getLogger("bench.openai_api")

TIMEOUT = 300.0


@dataclass(frozen=True, slots=True)
class OpenAIWork:
    tokens: int = 64  # new tokens per stream
    concurrency: tuple[int, ...] = (1, 8)
    rounds: int = 6
    turns: int = 10
    turn_tokens: int = 100
    conversations: int = 3

    @classmethod
    def quick(cls) -> OpenAIWork:
        return cls(tokens=32, rounds=1, turns=4, turn_tokens=30, conversations=1)


def available() -> str | None:
    try:
        import openai  # noqa: F401
    except ImportError:
        return "the openai package is not installed (pip install -e '.[bench]')"
    return None


def run(work: OpenAIWork, logs: Path, engine: str = "batched") -> dict[str, Any]:
    logs.mkdir(parents=True, exist_ok=True)
    with procs.wschat(engine, logs, sessions=64, name="wschat-openai-api") as server:
        figures = asyncio.run(_measure(server.ws_url, work))
    return {"workload": dataclasses.asdict(work), "engine": engine, **figures}


APIS = ("websocket", "openai-sdk", "http")


async def _measure(url: str, work: OpenAIWork) -> dict[str, Any]:
    import openai

    logging.getLogger("openai").setLevel(logging.WARNING)  # a line per request otherwise

    base = url.replace("ws://", "http://").removesuffix("/v1/chat") + "/v1"
    async with openai.AsyncOpenAI(base_url=base, api_key="-", timeout=TIMEOUT) as client:
        streamers: dict[str, Streamer] = {
            "websocket": lambda texts, n: wsload.concurrent(url, texts, n),
            "openai-sdk": lambda texts, n: _sdk_streams(client, texts, n),
            "http": lambda texts, n: _http_streams(base, texts, n),
        }
        figures = await paired_rounds(streamers, work)
        log.info(
            "a conversation of %d turns resent whole, %d times", work.turns, work.conversations
        )
        runs = [await _conversation(client, work) for _ in range(work.conversations)]
    ratios = {
        api: {
            n: {key: round_ratio(figures[api][n], figures["websocket"][n], key) for key in RATIOS}
            for n in work.concurrency
        }
        for api in APIS[1:]
    }
    turns = [
        {key: median([t[key] for t in turn]) for key in turn[0]} for turn in zip(*runs, strict=True)
    ]
    return {"streams": figures, "ratios": ratios, "conversation": turns}


Streamer = Callable[[list[str], int], Any]  # (texts, tokens) -> awaitable list[StreamTimes]


async def paired_rounds(
    streamers: dict[str, Streamer], work: OpenAIWork
) -> dict[str, dict[int, dict[str, Any]]]:
    """Each API's streams (``streamers``, the first the one the others are held to) at each
    concurrency, ``work.rounds`` times back to back, after a warm-up; per API and concurrency
    the round figures and the client's CPU time per round (this process's)."""
    apis = tuple(streamers)
    for a, api in enumerate(apis):  # warm-up
        await streamers[api]([unique(story(0), 99, a, 0)], 4)
    rounds: dict[str, dict[int, list[list[StreamTimes]]]] = {}
    cpu: dict[str, dict[int, list[float]]] = {}
    for api in apis:
        rounds[api] = {n: [] for n in work.concurrency}
        cpu[api] = {n: [] for n in work.concurrency}
    for r in range(work.rounds):
        for n in work.concurrency:
            # each goes first, second and last in turn: none always follows another's load
            order = apis[r % len(apis) :] + apis[: r % len(apis)]
            log.info("round %d: %d streams, %s", r + 1, n, " then ".join(order))
            for api in order:
                texts = [unique(story(i), r, apis.index(api), i) for i in range(n)]
                started = time.process_time()
                rounds[api][n].append(await streamers[api](texts, work.tokens))
                cpu[api][n].append(time.process_time() - started)
    return {
        api: {
            n: {**round_figures(per_round), "client_cpu_s": median(cpu[api][n])}
            for n, per_round in by_n.items()
        }
        for api, by_n in rounds.items()
    }


def unique(text: str, r: int, api: int, i: int) -> str:
    """``text`` after a tag of its own, of the same length for every stream: a prompt shares
    with the others what any new conversation does (the prompt format's opening), never a
    cached copy of itself that an earlier round or another API left."""
    return f"({r:02d}{api}{i:02d}) {text}"


def round_figures(rounds: list[list[StreamTimes]]) -> dict[str, Any]:
    per_round = [Concurrent.of(r) for r in rounds]
    rates = [median([s.rate for s in r]) for r in rounds]
    return {
        "aggregate_tps": median([c.aggregate for c in per_round]),
        "stream_tps": median(rates),
        "ttft_median_s": median([c.ttft_median for c in per_round]),
        "aggregate_tps_rounds": [c.aggregate for c in per_round],
        "stream_tps_rounds": rates,
        "ttft_median_s_rounds": [c.ttft_median for c in per_round],
    }


# Each an HTTP API's over the WebSocket's (TTFT the other way up: above 1 is better for all three)
RATIOS = ("aggregate_tps", "stream_tps", "ttft_median_s")


def round_ratio(api: dict[str, Any], ws: dict[str, Any], key: str) -> float:
    """The median over rounds of each round's ratio: the two ran back to back in a round, so
    the machine's other load, which moves from round to round, weighs on both alike."""
    pairs = list(zip(api[f"{key}_rounds"], ws[f"{key}_rounds"], strict=True))
    if key == "ttft_median_s":
        return median([w / s for s, w in pairs if s > 0])
    return median([s / w for s, w in pairs if w > 0])


async def _sdk_streams(client: Any, texts: list[str], tokens: int) -> list[StreamTimes]:
    """One streamed chat completion per text, all sent at once."""
    return list(await asyncio.gather(*(_sdk_stream(client, [_user(t)], tokens) for t in texts)))


async def _sdk_stream(
    client: Any, messages: list[dict[str, str]], tokens: int, facts: dict[str, Any] | None = None
) -> StreamTimes:
    """A chunk's tokens stamped when it came; those ``usage`` counts beyond the chunks (a merged
    chunk) at the last one. ``facts`` gets the usage and the reply's text."""
    times = StreamTimes(time.perf_counter(), [])
    stream = await client.chat.completions.create(
        model="embedded",
        messages=messages,
        max_tokens=tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts: list[str] = []
    usage, finish = None, None
    async with asyncio.timeout(TIMEOUT):
        async for chunk in stream:
            text = "".join(c.delta.content or "" for c in chunk.choices)
            if text:
                times.tokens.append(time.perf_counter())
                texts.append(text)
            usage = chunk.usage or usage
            finish = next((c.finish_reason for c in chunk.choices if c.finish_reason), finish)
    if usage is not None:
        merged_tokens(times, usage.completion_tokens, finish)
    if facts is not None:
        facts.update(usage=usage, text="".join(texts))
    return times


def merged_tokens(times: StreamTimes, completion_tokens: int, finish: str | None) -> None:
    """Those of ``completion_tokens`` that came in no chunk of their own (a merged chunk),
    stamped at the last chunk."""
    if times.tokens:
        # a reply that stopped ends with a token of no text (the end of turn), in no chunk
        shown = completion_tokens - (1 if finish == "stop" else 0)
        times.tokens.extend([times.tokens[-1]] * max(0, shown - len(times.tokens)))


async def _http_streams(base: str, texts: list[str], tokens: int) -> list[StreamTimes]:
    """One streamed chat completion per text through ``_http_stream``, all sent at once, each
    on a connection opened before (as the WebSocket's sessions are)."""
    where = urlsplit(base)
    host, port = where.hostname or "127.0.0.1", where.port or 80
    async with asyncio.timeout(TIMEOUT):
        conns = [await asyncio.open_connection(host, port) for _ in texts]
    try:
        return list(
            await asyncio.gather(
                *(
                    _http_stream(conn, f"{host}:{port}", where.path, t, tokens)
                    for conn, t in zip(conns, texts, strict=True)
                )
            )
        )
    finally:
        for _, writer in conns:
            writer.close()


async def _http_stream(
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    host: str,
    path: str,
    text: str,
    tokens: int,
) -> StreamTimes:
    """The request written whole, the chunked body's SSE events read as they come: a client
    whose own cost is next to nothing, so the figures are the server's."""
    reader, writer = conn
    body = json.dumps(
        {
            "model": "embedded",
            "messages": [_user(text)],
            "max_tokens": tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    head = (
        f"POST {path}/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    times = StreamTimes(time.perf_counter(), [])
    writer.write(head.encode() + body)
    usage, finish = None, None
    async with asyncio.timeout(TIMEOUT):
        status = await reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"the API answered {status!r}")
        while await reader.readline() not in (b"\r\n", b""):
            pass  # the headers: chunked, as every streamed reply is
        pending = b""
        while size := int((await reader.readline()).strip() or b"0", 16):
            pending += (await reader.readexactly(size + 2))[:-2]
            *events, pending = pending.split(b"\n\n")
            now = time.perf_counter()
            for event in events:
                data = event.removeprefix(b"data: ")
                if data == b"[DONE]":
                    continue
                chunk = json.loads(data)
                if any(c["delta"].get("content") for c in chunk["choices"]):
                    times.tokens.append(now)
                usage = chunk.get("usage") or usage
                finish = next(
                    (c["finish_reason"] for c in chunk["choices"] if c["finish_reason"]), finish
                )
        await reader.readline()  # the last chunk's blank line
    if usage is not None:
        merged_tokens(times, usage["completion_tokens"], finish)
    return times


async def _conversation(client: Any, work: OpenAIWork) -> list[dict[str, float]]:
    messages: list[dict[str, str]] = []
    out = []
    for text in CONVERSATION[: work.turns]:
        messages.append(_user(text))
        facts: dict[str, Any] = {}
        times = await _sdk_stream(client, messages, work.turn_tokens, facts)
        usage = facts["usage"]
        messages.append({"role": "assistant", "content": facts["text"]})
        out.append(
            {
                "ttft": times.ttft,
                "prompt_tokens": usage.prompt_tokens,
                "cached_tokens": usage.prompt_tokens_details.cached_tokens,
            }
        )
    return out


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def targets(result: dict[str, Any]) -> list[Target]:
    """Issue 26: the SDK's streams at 0.95 x the WebSocket's or better (tokens/s up, TTFT down),
    round by round; turn 10 resent whole reads 90 % of its prompt from cache, its TTFT at most
    1.3 x turn 1's."""
    rows = []
    streams = result["streams"]
    for n, ws in streams["websocket"].items():
        sdk = streams["openai-sdk"][n]
        for key, (label, unit) in LABELS.items():
            rows.append(
                Target.judged(
                    f"openai sdk {label} at {n} streams vs WebSocket",
                    value=sdk[key],
                    against=ws[key],
                    ratio=result["ratios"]["openai-sdk"][n][key],
                    limit=at_least(0.95),
                    unit=unit,
                )
            )
    return [*rows, *conversation_targets(result["conversation"], "resent whole", "prompt_tokens")]


def conversation_targets(turns: list[dict[str, float]], how: str, input_key: str) -> list[Target]:
    """A long conversation's two targets (issues 26 and 37): its last turn reads 90 % of its
    input (``input_key``: the usage's count of it) from cache, its TTFT at most 1.3 x turn 1's;
    ``how``: how the turns went on, as the labels say it."""
    last, first = turns[-1], turns[0]
    shown = last[input_key]
    return [
        Target.judged(
            f"turn {len(turns)} {how}: cached share of its {input_key.removesuffix('_tokens')}",
            value=last["cached_tokens"],
            against=shown,
            ratio=last["cached_tokens"] / shown if shown else None,
            limit=at_least(0.9),
            unit="tok",
        ),
        Target.judged(
            f"turn {len(turns)} {how}: TTFT vs turn 1",
            value=last["ttft"],
            against=first["ttft"],
            ratio=last["ttft"] / first["ttft"] if first["ttft"] else None,
            limit=at_most(1.3),
            unit="s",
        ),
    ]


LABELS: dict[str, tuple[str, Unit]] = {
    "aggregate_tps": ("tokens/s", "tok/s"),
    "stream_tps": ("stream tokens/s", "tok/s"),
    "ttft_median_s": ("TTFT (WebSocket's/SDK's)", "s"),
}
TABLE = (
    Column("api", 12, left=True),
    Column("streams", 8, "n"),
    Column("tok/s", 10),
    Column("stream tok/s", 14),
    Column("TTFT", 10, "ms"),
    Column("vs WebSocket: tok/s, TTFT", 28),
    Column("client CPU", 12, "ms"),
)


def stream_table(
    columns: tuple[Column, ...],
    streams: dict[str, dict[int, dict[str, Any]]],
    ratios: Callable[[str, int], dict[str, float] | None],
) -> Table:
    """A row per API and concurrency: its figures, and its tokens/s and TTFT ratios to the
    WebSocket's (``ratios``: None for the WebSocket's own rows)."""
    table = Table(columns)
    for api, by_n in streams.items():
        for n, f in by_n.items():
            against = ratios(api, n)
            versus = (
                f"{figure(against['aggregate_tps'], 'x')}, {figure(against['ttft_median_s'], 'x')}"
                if against
                else ""
            )
            figures = (f["aggregate_tps"], f["stream_tps"], f["ttft_median_s"])
            table.add(api, n, *figures, versus, f.get("client_cpu_s"))
    return table


def report(result: dict[str, Any]) -> Section:
    work = result["workload"]
    table = stream_table(
        TABLE, result["streams"], lambda api, n: result["ratios"].get(api, {}).get(n)
    )
    out = Section(
        [
            f"OpenAI-compatible API: wschat --engine {result['engine']} on the embedded model; "
            f"{work['tokens']} greedy tokens per stream, {work['rounds']} rounds, the WebSocket, "
            f"the SDK and a plain HTTP client back to back",
            table,
            "conversation resent whole through the SDK (median per turn):",
        ],
        targets(result),
    )
    for i, t in enumerate(result["conversation"], start=1):
        out.parts.append(
            f"  turn {i:>2}: prompt {t['prompt_tokens']:>5.0f}, cached {t['cached_tokens']:>5.0f},"
            f" TTFT {figure(t['ttft'], 'ms')}"
        )
    return out
