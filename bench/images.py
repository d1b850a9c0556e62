"""Image conversations in the batch: 8 sessions where half send an image in their first turn and
then text-only turns, against 8 sessions of text alone, on one server in the same rounds.

A turn with a new image runs on its own (``generate`` encodes the image); the text turns after it
come back to the batch on the KV state that turn left (engine/local/batched.py). This scenario
shows that they do with the engine's own counters, read from the server after every turn: the
turns of image conversations by the path that served them, and the rows per decode step while
the text turns ran; and what the images cost the text turns: their aggregate tokens/s against
the all-text conversations' (each round runs both, the order alternating).

The model is the tiny random vision model (the embedded 270M reads no images): the real vision
path (SigLIP tower, processor, placeholders, the ``generate`` hand-over) at a toy size, so the
counters are the point; its tokens/s measure mostly the engine's work per step. The server is
wschat's own app started as ``python -m bench.images`` (the server's options), which adds one
route, ``/bench/engine``, with those counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from . import procs, wsload
from .figures import Column, Section, Table, Target, at_least, at_most
from .llamacpp import paired_ratio
from .stats import StreamTimes, median

log = logging.getLogger("bench.images")

MODEL = "tiny-random-vision"
TURNS = (
    "Describe this picture.",
    "What colour is it?",
    "Is that colour bright or dark?",
    "Name something of that colour.",
    "Say it again in one word.",
)
KINDS = ("text", "images")  # every conversation text alone; half with an image in turn 1
TARGET = 0.9  # the text turns' aggregate tokens/s with images in the conversations, over without
COUNTERS = "/bench/engine"


@dataclass(frozen=True, slots=True)
class ImagesWork:
    sessions: int = 8
    turns: int = 4
    tokens: int = 32
    rounds: int = 3

    @classmethod
    def quick(cls) -> ImagesWork:
        return cls(turns=3, tokens=16, rounds=1)


# -- the arithmetic ---------------------------------------------------------------------------


def counters_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """What the engine counted between two readings of ``/bench/engine``."""
    out = {k: after[k] - before[k] for k in ("decode_steps", "decoded_tokens")}
    for path in ("batch", "generate"):
        out[f"image_turns_{path}"] = after["image_turns"][path] - before["image_turns"][path]
    return out


def phase_rate(phases: Sequence[Sequence[StreamTimes]]) -> float:
    """Aggregate tokens/s over turns run one after another, each with every session at once:
    their tokens over the sum of their spans (first send to last token)."""
    tokens = sum(len(s.tokens) for phase in phases for s in phase)
    span = sum(max(s.tokens[-1] for s in p if s.tokens) - min(s.sent for s in p) for p in phases)
    return tokens / span if span > 0 else float("nan")


def summary(turns: list[dict[str, Any]]) -> dict[str, Any]:
    """One run of the conversations: turn 1 and the text turns after it, each with its aggregate
    tokens/s and what the engine counted while it ran."""
    first, rest = turns[0], turns[1:]
    counted = {k: sum(t["counters"][k] for t in rest) for k in rest[0]["counters"]} if rest else {}
    steps = counted.get("decode_steps", 0)
    return {
        "first_turn_tps": phase_rate([first["streams"]]),
        "text_turns_tps": phase_rate([t["streams"] for t in rest]),
        "turn_tps": [phase_rate([t["streams"]]) for t in turns],
        "first_turn": first["counters"],
        "text_turns": counted,
        "rows_per_step": counted["decoded_tokens"] / steps if steps else float("nan"),
    }


def figures(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per kind: medians over rounds, each round's text-turn rate, the counters summed."""
    out = {}
    for kind, rounds in runs.items():
        counted = [r["text_turns"] for r in rounds]
        out[kind] = {
            "first_turn_tps": median([r["first_turn_tps"] for r in rounds]),
            "text_turns_tps": median([r["text_turns_tps"] for r in rounds]),
            "text_turns_rounds": [r["text_turns_tps"] for r in rounds],
            "rows_per_step": median([r["rows_per_step"] for r in rounds]),
            "turn_tps": [
                median(list(t)) for t in zip(*(r["turn_tps"] for r in rounds), strict=True)
            ],
            "text_turns": {k: sum(c[k] for c in counted) for k in counted[0]},
            "first_turn": {
                k: sum(r["first_turn"][k] for r in rounds) for k in rounds[0]["first_turn"]
            },
        }
    return out


def expected_batched(work: dict[str, Any]) -> int:
    """Text turns of image conversations in a run: half the sessions, every turn after the first,
    every round."""
    return int(work["sessions"] // 2 * (work["turns"] - 1) * work["rounds"])


def targets(result: dict[str, Any]) -> list[Target]:
    """The text turns of image conversations all in the batch; their rate within TARGET."""
    mixed, text = result["figures"]["images"], result["figures"]["text"]
    batched, alone = (
        mixed["text_turns"]["image_turns_batch"],
        mixed["text_turns"]["image_turns_generate"],
    )
    want = expected_batched(result["workload"])
    in_batch = Target.judged(
        "images: text turns after an image served in the batch (of all)",
        value=float(batched),
        against=float(want),
        ratio=float(alone),
        limit=at_most(0.0, "n"),
        unit="n",
    )
    rate = Target.judged(
        f"images: text turns agg tok/s >= {TARGET} x all-text",
        value=mixed["text_turns_tps"],
        against=text["text_turns_tps"],
        ratio=result["text_turns_x"],
        limit=at_least(TARGET),
    )
    # none alone is not enough: every text turn is counted in the batch
    return [dataclasses.replace(in_batch, met=alone == 0 and batched == want), rate]


TABLE = (
    Column("conversations", 15, left=True),
    Column("turn 1 tok/s", 13),
    Column("text turns tok/s", 18),
    Column("vs text", 9, "x"),
    Column("rows/step", 11, ".2f"),
    Column("image turns: batch / generate (turn 1; later)", 48),
)


def report(result: dict[str, Any]) -> Section:
    work = result["workload"]
    table = Table(TABLE)
    for kind, f in result["figures"].items():
        first, rest = f["first_turn"], f["text_turns"]
        paths = (
            f"{first['image_turns_batch']} / {first['image_turns_generate']}; "
            f"{rest['image_turns_batch']} / {rest['image_turns_generate']}"
        )
        ratio = result["text_turns_x"] if kind == "images" else 1.0
        table.add(kind, f["first_turn_tps"], f["text_turns_tps"], ratio, f["rows_per_step"], paths)
    for kind, f in result["figures"].items():
        rates = ", ".join(f"{rate:.1f}" for rate in f["turn_tps"])
        table.line(f"{kind}: tokens/s by turn (median over rounds): {rates}")
    return Section(
        [
            f"image conversations: {work['sessions']} sessions on {result['model']} (batch "
            f"width {work['sessions']}), {work['turns']} turns of {work['tokens']} tokens, "
            "every session at once each turn;",
            f"'images': half send an image in turn 1; median of {work['rounds']} rounds; the "
            "engine's counters summed over rounds",
            table,
        ],
        targets(result),
    )


# -- the measurement --------------------------------------------------------------------------


def picture(i: int) -> bytes:
    """A small PNG in a colour of its own."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (64, 64), (40 * i % 256, 90, 200 - 20 * i % 200)).save(out, "PNG")
    return out.getvalue()


async def _counters(client: httpx.AsyncClient) -> dict[str, Any]:
    reading: dict[str, Any] = (await client.get(COUNTERS)).json()
    return reading


async def conversations(base: str, ws_url: str, work: ImagesWork, images: bool) -> dict[str, Any]:
    """Every session's turns, all sessions at once each turn; what each turn counted."""
    turns = []
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=base, timeout=30))
        peers = [
            await stack.enter_async_context(wsload.session(ws_url)) for _ in range(work.sessions)
        ]
        for t in range(work.turns):
            text = TURNS[t % len(TURNS)]
            before = await _counters(client)
            served = await asyncio.gather(
                *(
                    wsload.stream(peer, text, work.tokens, f"t{t}", _images(images, t, i))
                    for i, peer in enumerate(peers)
                )
            )
            after = await _counters(client)
            turns.append(
                {"streams": [s for s, _ in served], "counters": counters_delta(before, after)}
            )
    return summary(turns)


def _images(images: bool, turn: int, session: int) -> list[bytes]:
    return [picture(session)] if images and turn == 0 and session % 2 == 0 else []


def run(work: ImagesWork, logs: Path, engine: str = "batched") -> dict[str, Any]:
    logs.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    log.info("starting wschat --model %s --engine %s with the engine's counters", MODEL, engine)
    extra = ("--model", MODEL, "--max-concurrent", str(work.sessions))
    server_cm = procs.wschat(engine, logs, 64, extra, name="wschat-images", module="bench.images")
    with server_cm as server:
        warm = dataclasses.replace(work, turns=2, tokens=4)
        asyncio.run(conversations(server.base, server.ws_url, warm, True))
        for r in range(work.rounds):
            order = KINDS if r % 2 == 0 else KINDS[::-1]
            for kind in order:
                log.info("round %d: %d conversations, %s", r + 1, work.sessions, kind)
                runs[kind].append(
                    asyncio.run(conversations(server.base, server.ws_url, work, kind == "images"))
                )
    return {
        "workload": dataclasses.asdict(work),
        "engine": engine,
        "model": MODEL,
        "figures": figures(runs),
        "text_turns_x": paired_ratio(
            [r["text_turns_tps"] for r in runs["images"]],
            [r["text_turns_tps"] for r in runs["text"]],
        ),
    }


# -- the server -------------------------------------------------------------------------------


def serve(argv: Sequence[str]) -> int:
    """wschat's server as ``wschat-server`` runs it, plus ``/bench/engine``: the batched engine's
    counters (decode steps, rows decoded, turns of image conversations by path)."""
    import uvicorn
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from wschat.server.runtime.cli import settings_from_args
    from wschat.server.runtime.engines import make_engine
    from wschat.server.runtime.serve import uvicorn_config
    from wschat.server.web.app import build_app

    settings = settings_from_args(argv)
    app = build_app(settings, lambda: make_engine(settings))
    hub = app.state.hub

    async def counters(request: Request) -> JSONResponse:
        engine = hub.engine
        return JSONResponse(
            {
                "decode_steps": getattr(engine, "decode_steps", 0),
                "decoded_tokens": getattr(engine, "decoded_tokens", 0),
                "image_turns": getattr(engine, "image_turns", {"batch": 0, "generate": 0}),
            }
        )

    app.router.routes.append(Route(COUNTERS, counters))
    uvicorn.Server(uvicorn_config(settings, app)).run()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    raise SystemExit(serve(sys.argv[1:]))
