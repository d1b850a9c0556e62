"""One benchmark run: the in-process ceiling and the server, interleaved round by round so that
the machine's drift hits both alike; then the conversation, cancels, idle sessions, the other
engine, transformers' continuous batching in process, and the peer."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import peer, procs, wsload
from .inprocess import InProcess
from .stats import Concurrent, StreamTimes, median, percentile
from .workload import CONVERSATION, Workload

log = logging.getLogger("bench")


def _figures(rounds: list[list[StreamTimes]]) -> dict[str, Any]:
    """Rounds of one concurrency: aggregate is the median of rounds; latencies pool them."""
    pooled = [s for r in rounds for s in r]
    per_round = [Concurrent.of(r) for r in rounds]
    whole = Concurrent.of(pooled)  # its aggregate mixes rounds: only its latencies are used
    return {
        "streams": per_round[0].streams,
        "tokens": per_round[0].tokens,
        "aggregate_tps": median([c.aggregate for c in per_round]),
        "stream_tps": median([s.rate for s in pooled]),
        "ttft_median_s": whole.ttft_median,
        "ttft_p95_s": whole.ttft_p95,
        "itl_median_s": median([g for s in pooled for g in s.gaps]),
        "itl_p95_s": whole.itl_p95,
        "rounds": len(rounds),
        "aggregate_rounds": [c.aggregate for c in per_round],
        "stream_tps_rounds": [median([s.rate for s in r]) for r in rounds],
    }


def _server_streams(url: str, texts: list[str], tokens: int) -> list[StreamTimes]:
    return asyncio.run(wsload.concurrent(url, texts, tokens))


def _rounds(
    work: Workload, measure: Callable[[list[str], int], list[StreamTimes]], repeats: int
) -> dict[int, list[list[StreamTimes]]]:
    out: dict[int, list[list[StreamTimes]]] = {n: [] for n in work.concurrency}
    for _ in range(repeats):
        for n in work.concurrency:
            out[n].append(measure(work.texts(n), work.tokens))
    return out


def run(work: Workload, *, engine: str, peer_wanted: bool, logs: Path) -> dict[str, Any]:
    logs.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"workload": dataclasses.asdict(work)}
    log.info("loading the model in process (the ceiling)")
    local = InProcess.load()
    local.static(work.texts(1), 4)  # warm-up
    ceiling: dict[int, list[list[StreamTimes]]] = {n: [] for n in work.concurrency}
    ours: dict[int, list[list[StreamTimes]]] = {n: [] for n in work.concurrency}
    log.info("starting wschat --engine %s", engine)
    with procs.wschat(engine, logs, sessions=work.idle_sessions + 50) as server:
        url = server.ws_url
        _server_streams(url, work.texts(1), 4)  # warm-up
        for r in range(work.repeats):
            for n in work.concurrency:
                log.info("round %d: %d streams, ceiling then server", r + 1, n)
                ceiling[n].append(local.static(work.texts(n), work.tokens))
                ours[n].append(_server_streams(url, work.texts(n), work.tokens))
        log.info("conversation of %d turns", len(CONVERSATION))
        turns = asyncio.run(wsload.conversation(url, list(CONVERSATION), work.turn_tokens))
        log.info("%d cancels", work.cancels)
        cancel_waits = asyncio.run(wsload.cancels(url, work.texts(1)[0], work.cancels))
        log.info("%d idle sessions", work.idle_sessions)
        result["memory"] = asyncio.run(_memory(server, url, work.idle_sessions))
    result["ceiling"] = {n: _figures(r) for n, r in ceiling.items()}
    result[f"wschat-{engine}"] = {n: _figures(r) for n, r in ours.items()}
    result["engine"] = engine
    result["conversation"] = turns
    step = result["ceiling"][1]["itl_median_s"]
    result["cancel"] = {
        "count": len(cancel_waits),
        "median_s": median(cancel_waits),
        "p95_s": percentile(cancel_waits, 95),
        "decode_step_s": step,
    }
    for other in work.other_engines:
        if other == engine:
            continue
        log.info("starting wschat --engine %s", other)
        with procs.wschat(other, logs) as server:
            _server_streams(server.ws_url, work.texts(1), 4)
            rounds = _rounds(work, lambda t, k: _server_streams(server.ws_url, t, k), 1)
        result[f"wschat-{other}"] = {n: _figures(r) for n, r in rounds.items()}
    log.info("transformers continuous batching manager, in process")
    try:
        cb = {n: [local.continuous(work.texts(n), work.tokens)] for n in (1, max(work.concurrency))}
        result["transformers-cb-inprocess"] = {n: _figures(r) for n, r in cb.items()}
    except Exception as error:  # a failure here must not lose the rest of the run
        log.exception("continuous batching in process failed")
        result["transformers-cb-inprocess"] = {"error": repr(error)}
    del local
    result["peers"] = _peers(work, logs) if peer_wanted else {"skipped": "--no-peer"}
    return result


async def _memory(server: procs.Running, url: str, count: int) -> dict[str, Any]:
    await asyncio.sleep(1.0)
    before = server.rss()
    started = time.perf_counter()
    async with wsload.idle_sessions(url, count):
        await asyncio.sleep(2.0)  # let the server settle what it allocated per session
        after = server.rss()
        connect_s = time.perf_counter() - started
    return {
        "sessions": count,
        "rss_none_mb": before / 2**20,
        "rss_idle_mb": after / 2**20,
        "delta_mb": (after - before) / 2**20,
        "connect_s": connect_s,
    }


def _peers(work: Workload, logs: Path) -> dict[str, Any]:
    why_not = procs.peer_available()
    if why_not:
        return {"skipped": why_not}
    model_dir = InProcess.model_dir()
    out: dict[str, Any] = {}
    for batching in (False, True):
        name = "transformers-serve-cb" if batching else "transformers-serve"
        log.info("starting %s", name)
        try:
            with procs.transformers_serve(Path(model_dir), batching, logs) as server:
                asyncio.run(peer.concurrent(server.base, model_dir, ["Hi"], 4))  # warm-up
                figures = {}
                for n in work.peer_concurrency:
                    log.info("%s: %d streams", name, n)
                    streams = asyncio.run(
                        peer.concurrent(server.base, model_dir, work.texts(n), work.tokens)
                    )
                    figures[n] = _figures([streams])
                out[name] = figures
        except Exception as error:
            log.exception("%s failed", name)
            out[name] = {"error": repr(error)}
    return out
