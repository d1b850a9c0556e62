"""One benchmark run. The in-process ceiling, the server, the peer with continuous batching and
llama.cpp's server are measured back to back in each round, so the drift of a shared machine's
load hits all of them alike; then the conversation, the staggered arrivals (bench/arrivals.py),
cancels, idle sessions, the other engine, transformers' continuous batching manager in process,
and the peer without continuous batching."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import arrivals, llamacpp, peer, procs, wsload
from .inprocess import InProcess
from .stats import StreamTimes, figures_over_rounds, median, percentile
from .workload import CONVERSATION, Workload

log = logging.getLogger("bench")


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
    systems = ["ceiling", f"wschat-{engine}"]
    why_not = procs.peer_available() if peer_wanted else "--no-peer"
    if why_not is None:
        systems.append("transformers-serve-cb")
    llama_why_not = llamacpp.available() if peer_wanted else "--no-peer"
    if llama_why_not is None:
        systems.append(llamacpp.PEER)
    rounds: dict[str, dict[int, list[list[StreamTimes]]]] = {
        name: {n: [] for n in work.concurrency} for name in systems
    }
    log.info("starting wschat --engine %s", engine)
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(procs.wschat(engine, logs, sessions=work.idle_sessions + 50))
        url = server.ws_url
        _server_streams(url, work.texts(1), 4)  # warm-up
        measure: dict[str, Callable[[list[str], int], list[StreamTimes]]] = {
            "ceiling": local.static,
            f"wschat-{engine}": lambda t, k: _server_streams(url, t, k),
        }
        if why_not is None:
            # The peer with continuous batching takes part in every round, beside ours (an idle
            # server takes no CPU); the other peer is measured on its own afterwards.
            log.info("starting transformers serve --continuous-batching")
            peer_server = stack.enter_context(
                procs.transformers_serve(Path(InProcess.model_dir()), True, logs)
            )
            model_dir = InProcess.model_dir()
            asyncio.run(peer.concurrent(peer_server.base, model_dir, ["Hi"], 4))  # warm-up
            measure["transformers-serve-cb"] = lambda t, k: asyncio.run(
                peer.concurrent(peer_server.base, model_dir, t, k)
            )
        if llama_why_not is None:
            # llama.cpp's server on the same GGUF with as many threads as ours takes on free
            # cores, on the same cores as the rest, in every round beside ours
            threads = len(os.sched_getaffinity(0))
            log.info("starting llama.cpp's server, %d threads", threads)
            slots = max(work.concurrency)
            measure[llamacpp.PEER] = stack.enter_context(llamacpp.peer(logs, slots, threads))
        for r in range(work.repeats):
            for n in work.concurrency:
                log.info("round %d: %d streams: %s", r + 1, n, ", ".join(systems))
                for name in systems:
                    rounds[name][n].append(measure[name](work.texts(n), work.tokens))
        log.info("conversation of %d turns", len(CONVERSATION))
        runs = [
            asyncio.run(wsload.conversation(url, list(CONVERSATION), work.turn_tokens))
            for _ in range(work.conversations)
        ]
        turns = [
            {**run_turns[0], "ttft": median([t["ttft"] for t in run_turns])}
            for run_turns in zip(*runs, strict=True)
        ]
        result["conversation_runs"] = [[t["ttft"] for t in run_turns] for run_turns in runs]
        log.info("staggered arrivals")
        result["arrivals"] = arrivals.run(arrivals.ArrivalsWork.of(work), url, local)
        log.info("%d cancels", work.cancels)
        cancel_waits = asyncio.run(wsload.cancels(url, work.texts(1)[0], work.cancels))
        log.info("%d idle sessions", work.idle_sessions)
        result["memory"] = asyncio.run(_memory(server, url, work.idle_sessions))
    for name in ("ceiling", f"wschat-{engine}"):
        result[name] = {n: figures_over_rounds(r) for n, r in rounds[name].items()}
    peers: dict[str, Any] = {"skipped": why_not} if why_not else {}
    if "transformers-serve-cb" in rounds:
        peers["transformers-serve-cb"] = {
            n: figures_over_rounds(r) for n, r in rounds["transformers-serve-cb"].items()
        }
    peers[llamacpp.PEER] = (
        {n: figures_over_rounds(r) for n, r in rounds[llamacpp.PEER].items()}
        if llama_why_not is None
        else llama_why_not
    )
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
            by_n = _rounds(work, lambda t, k: _server_streams(server.ws_url, t, k), 1)
        result[f"wschat-{other}"] = {n: figures_over_rounds(r) for n, r in by_n.items()}
    log.info("transformers continuous batching manager, in process")
    try:
        cb = {n: [local.continuous(work.texts(n), work.tokens)] for n in (1, max(work.concurrency))}
        result["transformers-cb-inprocess"] = {n: figures_over_rounds(r) for n, r in cb.items()}
    except Exception as error:  # a failure here must not lose the rest of the run
        log.exception("continuous batching in process failed")
        result["transformers-cb-inprocess"] = {"error": repr(error)}
    del local
    if why_not is None:
        peers.update(_plain_peer(work, logs))
    result["peers"] = peers
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


def _plain_peer(work: Workload, logs: Path) -> dict[str, Any]:
    """``transformers serve`` without continuous batching: one round (it serves one at a time)."""
    model_dir = InProcess.model_dir()
    name = "transformers-serve"
    log.info("starting %s", name)
    try:
        with procs.transformers_serve(Path(model_dir), False, logs) as server:
            asyncio.run(peer.concurrent(server.base, model_dir, ["Hi"], 4))  # warm-up
            figures = {}
            for n in work.peer_concurrency:
                log.info("%s: %d streams", name, n)
                streams = asyncio.run(
                    peer.concurrent(server.base, model_dir, work.texts(n), work.tokens)
                )
                figures[n] = figures_over_rounds([streams])
        return {name: figures}
    except Exception as error:  # a failure here must not lose the rest of the run
        log.exception("%s failed", name)
        return {name: {"error": repr(error)}}
