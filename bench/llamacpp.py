"""The llama.cpp scenario: llama.cpp's server (``xllamacpp``) on the embedded GGUF as a CPU peer,
measured directly through its OpenAI API and through ``wschat --engine openai`` in front of it,
with wschat's in-process engine beside them on the same prompts and the same threads.

Every round measures every system back to back at each stream count (the order alternates from
round to round), so a drift of a shared machine's load hits them alike; each ratio is the median
of round-by-round ratios. llama.cpp direct gets the very request body the gateway sends (the
first turn's token ids, every sampling field, greedy, the ids asked back), built by the gateway's
own code. Then cancels: a reply cancelled through wschat, timed to its ``done`` and to the moment
llama.cpp's ``/slots`` shows no slot processing; and the same for a stream closed directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from . import procs, wsload
from .inprocess import PROMPT_FORMAT
from .run import _figures
from .stats import Concurrent, StreamTimes, median, percentile
from .workload import story

log = logging.getLogger("bench.llamacpp")

DIRECT = "llama.cpp direct"
GATEWAY = "wschat-openai"
PEER = "llama.cpp-server"  # the peer row of the main run (bench/run.py)
TARGET_RATIO = 0.95  # aggregate tokens/s of wschat in front, over llama.cpp direct
TTFT_LIMIT_S = 0.015  # TTFT over llama.cpp direct's
JUDGED = (1, 8)  # the stream counts the targets hold
SLOT_CONTEXT = 1024  # KV tokens per llama.cpp slot: a prompt and its reply fit many times
POLL_S = 0.002  # /slots polling while waiting for idle
IDLE_TIMEOUT_S = 10.0
TIMEOUT = 600.0


@dataclass(frozen=True, slots=True)
class LlamaWork:
    tokens: int = 64
    streams: tuple[int, ...] = (1, 4, 8)
    rounds: int = 3
    threads: int = 0  # 0: every engine core (see split_cores)
    cancels: int = 10
    inprocess: bool = True  # wschat's in-process engine as a row beside them
    # The engine on cores of its own, the gateway and the load generator on the last core, as
    # where the engine has its own machine. Shared cores measure the scheduler instead: llama.cpp's
    # threads spin between steps, and a third runnable process stalls a whole step.
    split_cores: bool = True

    @classmethod
    def quick(cls) -> LlamaWork:
        return cls(tokens=16, rounds=1, cancels=3)

    def cores(self) -> tuple[set[int], set[int]]:
        """(the engine's cores, the front's: gateway and load generator)."""
        usable = sorted(os.sched_getaffinity(0))
        if not self.split_cores or len(usable) < 2:
            return set(usable), set(usable)
        return set(usable[:-1]), {usable[-1]}

    def thread_count(self) -> int:
        return self.threads or len(self.cores()[0])


def available() -> str | None:
    """Why llama.cpp's server cannot run here, or None when it can."""
    try:
        import xllamacpp  # noqa: F401
    except ImportError:
        return "xllamacpp is not installed (pip install xllamacpp)"
    return None


# -- the arithmetic ---------------------------------------------------------------------------


def paired_ratio(ours: Sequence[float], theirs: Sequence[float]) -> float:
    """The median of round-by-round ratios (rounds ran back to back, so drift cancels)."""
    if not ours or len(ours) != len(theirs):
        return float("nan")
    pairs = zip(ours, theirs, strict=True)
    return float(statistics.median(a / b if b > 0 else float("nan") for a, b in pairs))


def paired_difference(ours: Sequence[float], theirs: Sequence[float]) -> float:
    """The median of round-by-round differences."""
    if not ours or len(ours) != len(theirs):
        return float("nan")
    return float(statistics.median(a - b for a, b in zip(ours, theirs, strict=True)))


def figures_of(rounds: list[list[StreamTimes]]) -> dict[str, Any]:
    """The usual figures of one system at one stream count, plus each round's median TTFT."""
    return {**_figures(rounds), "ttft_rounds": [Concurrent.of(r).ttft_median for r in rounds]}


def compare(figures: dict[str, dict[int, dict[str, Any]]]) -> dict[str, dict[int, Any]]:
    """Each system against llama.cpp direct at each stream count: aggregate tokens/s as a ratio,
    median TTFT as a difference in seconds."""
    direct = figures[DIRECT]
    out: dict[str, dict[int, Any]] = {}
    for system, by_n in figures.items():
        out[system] = {
            n: {
                "aggregate_x": paired_ratio(
                    f["aggregate_tps_rounds"], direct[n]["aggregate_tps_rounds"]
                ),
                "ttft_diff_s": paired_difference(f["ttft_rounds"], direct[n]["ttft_rounds"]),
            }
            for n, f in by_n.items()
        }
    return out


def cancel_summary(waits: list[dict[str, float]]) -> dict[str, Any]:
    """Median and p95 of each timing a cancel measured (seconds)."""
    keys = sorted({k for w in waits for k in w})
    return {
        "count": len(waits),
        **{
            k: {
                "median_s": median([w[k] for w in waits if k in w]),
                "p95_s": percentile([w[k] for w in waits if k in w], 95),
            }
            for k in keys
        },
    }


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """wschat in front of llama.cpp against llama.cpp direct, at each judged stream count:
    aggregate tokens/s within TARGET_RATIO, median TTFT within TTFT_LIMIT_S."""
    figures, compared, rows = result["figures"], result["compared"][GATEWAY], []
    for n in JUDGED:
        if n not in figures[GATEWAY]:
            continue
        what = "1 stream" if n == 1 else f"{n} streams"
        ours, direct = figures[GATEWAY][n], figures[DIRECT][n]
        ratio, diff = compared[n]["aggregate_x"], compared[n]["ttft_diff_s"]
        rows += [
            {"target": f"llama.cpp, {what}: wschat agg tok/s >= {TARGET_RATIO} x direct",
             "value": ours["aggregate_tps"], "against": direct["aggregate_tps"], "unit": "",
             "ratio": ratio, "ratio_unit": "x", "limit": TARGET_RATIO, "op": ">=",
             "met": ratio >= TARGET_RATIO},
            {"target": f"llama.cpp, {what}: wschat TTFT <= direct + "
                       f"{TTFT_LIMIT_S * 1000:.0f} ms",
             "value": ours["ttft_median_s"], "against": direct["ttft_median_s"], "unit": "ms",
             "ratio": diff, "ratio_unit": "ms", "limit": TTFT_LIMIT_S, "op": "<=",
             "met": diff <= TTFT_LIMIT_S},
        ]  # fmt: skip
    return rows


def table(result: dict[str, Any], fmt: Callable[[Any, str], str]) -> str:
    work = result["workload"]
    lines = [
        f"llama.cpp's server (xllamacpp {result.get('xllamacpp', '?')}) on the embedded GGUF, "
        f"{result['threads']} threads on cores {result.get('engine_cores', '?')}, "
        f"{result['slots']} slots; wschat --engine openai in front and the load generator on "
        f"cores {result.get('front_cores', '?')};",
        f"{work['tokens']} tokens per stream, greedy, median of {work['rounds']} rounds; "
        "ratios and differences are to llama.cpp direct, round by round",
    ]
    head = f"{'system':<24}{'streams':>8}{'agg tok/s':>11}{'stream tok/s':>13}"
    head += f"{'TTFT med':>10}{'TTFT p95':>10}{'agg vs direct':>15}{'TTFT - direct':>15}"
    lines += [head, "-" * len(head)]
    for system, by_n in result["figures"].items():
        for n, f in sorted(by_n.items()):
            c = result["compared"][system][n]
            lines.append(
                f"{system:<24}{n:>8}{f['aggregate_tps']:>11.1f}{f['stream_tps']:>13.1f}"
                f"{fmt(f['ttft_median_s'], 'ms'):>10}{fmt(f['ttft_p95_s'], 'ms'):>10}"
                f"{fmt(c['aggregate_x'], 'x'):>15}{fmt(c['ttft_diff_s'], 'ms'):>15}"
            )
    c = result["cancel"]
    parts = [
        f"{label} median {fmt(c[key]['median_s'], 'ms')}, p95 {fmt(c[key]['p95_s'], 'ms')}"
        for key, label in (
            ("done_s", "cancel to done"),
            ("idle_s", "cancel to slot idle"),
            ("direct_idle_s", "direct close to slot idle"),
        )
        if key in c
    ]
    lines.append(f"cancels ({c['count']}x, read from llama.cpp's /slots): " + "; ".join(parts))
    return "\n".join(lines)


# -- the measurements -------------------------------------------------------------------------


def _tokens_in(chunk: dict[str, Any]) -> int:
    """Tokens one streamed chunk carries: its ids (asked for), else one per chunk with text."""
    if "tokens" in chunk:  # llama.cpp's native /completion
        return len(chunk["tokens"])
    count = 0
    for choice in chunk.get("choices") or ():
        ids = (choice.get("logprobs") or {}).get("content") or []
        count += len(ids) or (1 if choice.get("text") else 0)
    return count


async def direct_stream(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> StreamTimes:
    times = StreamTimes(time.perf_counter(), [])
    async with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            times.tokens += [now] * _tokens_in(json.loads(line[len("data: ") :]))
    return times


async def direct_concurrent(url: str, bodies: list[dict[str, Any]]) -> list[StreamTimes]:
    limits = httpx.Limits(max_connections=len(bodies) + 1)
    async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits) as client:
        return list(await asyncio.gather(*(direct_stream(client, url, b) for b in bodies)))


class Direct:
    """llama.cpp's server spoken to as the gateway speaks to it: the same request bodies, built
    by the gateway's own code (``OpenAIEngine.completion_body``)."""

    def __init__(self, base: str) -> None:
        from wschat.server.engine.history import Conversation
        from wschat.server.engine.openai import OpenAIEngineConfig, connect
        from wschat.server.engine.openai.tokenizer import default_cache_dir

        config = OpenAIEngineConfig(
            f"{base}/v1", "embedded", default_cache_dir(), prompt_format=PROMPT_FORMAT
        )
        self.engine = connect(config)
        self.url = f"{base}{self.engine.dialect.text_path}"
        self._conversation = Conversation  # the engine only builds bodies here: no client

    def body(self, text: str, tokens: int) -> dict[str, Any]:
        from wschat.server.engine.base import GenerationRequest, SamplingParams

        conversation = self._conversation(self.engine.prompt_format)
        ids = conversation.prompt_ids(conversation.tokenize_user(text))
        params = SamplingParams(max_new_tokens=tokens, temperature=0.0)
        return self.engine.completion_body(GenerationRequest(ids, params))

    def streams(self, texts: list[str], tokens: int) -> list[StreamTimes]:
        bodies = [self.body(t, tokens) for t in texts]
        return asyncio.run(direct_concurrent(self.url, bodies))


@contextlib.contextmanager
def peer(logs: Path, slots: int, threads: int) -> Iterator[Callable[[list[str], int], Any]]:
    """llama.cpp's server as a peer row of the main run: ``threads`` threads on the cores the
    rest of the run shares, ``slots`` slots, measured directly with the gateway's request bodies
    (``Direct``); warmed up at ``slots`` streams (its first use of a slot is slow)."""
    with procs.llama_cpp(threads, slots, SLOT_CONTEXT, logs) as llama:
        direct = Direct(llama.base)
        direct.streams([story(i) for i in range(slots)], 4)
        yield direct.streams


async def _idle_after(http: httpx.AsyncClient, slots_url: str, since: float) -> float:
    """Seconds from ``since`` until llama.cpp's /slots shows no slot processing."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while time.monotonic() < deadline:
        slots = (await http.get(slots_url)).json()
        if not any(slot.get("is_processing") for slot in slots):
            return time.perf_counter() - since
        await asyncio.sleep(POLL_S)
    raise RuntimeError(f"a slot still processing {IDLE_TIMEOUT_S:.0f} s after a cancel")


async def gateway_cancels(
    ws_url: str, slots_url: str, text: str, count: int, after_tokens: int = 4
) -> list[dict[str, float]]:
    """Cancel a reply through wschat mid-stream: seconds to its ``done`` and to an idle slot."""
    waits = []
    params = {"max_new_tokens": 500, "temperature": 0}
    async with wsload.session(ws_url) as peer, httpx.AsyncClient(timeout=10) as http:
        for i in range(count):
            frame_id = f"c{i}"
            await peer.send({"type": "prompt", "id": frame_id, "text": text, "params": params})
            while (frame := await peer.recv())["type"] != "token" or frame["index"] < after_tokens:
                pass
            sent = time.perf_counter()
            await peer.send({"type": "cancel", "id": frame_id})
            while (frame := await peer.recv())["type"] != "done":
                pass
            done = time.perf_counter() - sent
            idle = await _idle_after(http, slots_url, sent)
            waits.append({"done_s": done, "idle_s": idle})
            await peer.send({"type": "reset", "id": f"r{i}"})  # keep the prompt short
            while (await peer.recv())["type"] != "reset_ok":
                pass
    return waits


async def direct_cancels(
    direct: Direct, slots_url: str, text: str, count: int, after_tokens: int = 4
) -> list[float]:
    """Close a direct stream mid-reply: seconds until llama.cpp's slot is idle."""
    waits = []
    body = direct.body(text, 500)
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        for _ in range(count):
            seen = 0
            async with client.stream("POST", direct.url, json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        seen += _tokens_in(json.loads(line[len("data: ") :]))
                    if seen >= after_tokens:
                        break
                sent = time.perf_counter()
            # leaving the block closed the connection: llama.cpp's abort
            waits.append(await _idle_after(client, slots_url, sent))
    return waits


@contextlib.contextmanager
def _pinned(cores: set[int]) -> Iterator[None]:
    """This process on ``cores`` while in the block."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def run(work: LlamaWork, logs: Path, engine: str = "batched") -> dict[str, Any]:
    import xllamacpp

    logs.mkdir(parents=True, exist_ok=True)
    threads, slots = work.thread_count(), max(work.streams)
    engine_cores, front_cores = work.cores()
    systems = [DIRECT, GATEWAY] + ([f"wschat-{engine}"] if work.inprocess else [])
    rounds: dict[str, dict[int, list[list[StreamTimes]]]] = {
        s: {n: [] for n in work.streams} for s in systems
    }
    with contextlib.ExitStack() as stack:
        stack.enter_context(_pinned(front_cores))  # the load generator
        log.info(
            "starting llama.cpp's server: %d threads on cores %s, %d slots; the gateway and the "
            "load generator on cores %s",
            threads,
            sorted(engine_cores),
            slots,
            sorted(front_cores),
        )
        llama = stack.enter_context(
            procs.llama_cpp(threads, slots, SLOT_CONTEXT, logs, cores=engine_cores)
        )
        slots_url = f"{llama.base}/slots"
        direct = Direct(llama.base)
        log.info("starting wschat --engine openai in front of it")
        gateway_args = ("--engine-url", f"{llama.base}/v1", "--tokenizer", "embedded")
        gateway = stack.enter_context(
            procs.wschat(
                "openai", logs, 64, gateway_args, name="wschat-openai-llamacpp", cores=front_cores
            )
        )
        measure: dict[str, Callable[[list[str], int], list[StreamTimes]]] = {
            DIRECT: direct.streams,
            GATEWAY: lambda t, k: asyncio.run(wsload.concurrent(gateway.ws_url, t, k)),
        }
        if work.inprocess:
            log.info("starting wschat --engine %s --threads %d", engine, threads)
            local = stack.enter_context(procs.wschat(engine, logs, 64, ("--threads", str(threads))))
            measure[f"wschat-{engine}"] = lambda t, k: asyncio.run(
                wsload.concurrent(local.ws_url, t, k)
            )
        # warm-up at the widest count: llama.cpp's first use of a slot is slow (2.9 s to the
        # first token of 8 fresh slots, 0.1 s after), and whoever came first would pay it
        for system in systems:
            measure[system]([story(i) for i in range(slots)], 4)
        for r in range(work.rounds):
            order = systems if r % 2 == 0 else systems[::-1]
            for n in work.streams:
                texts = [story(i) for i in range(n)]
                log.info("round %d: %d streams: %s", r + 1, n, ", ".join(order))
                for system in order:
                    rounds[system][n].append(measure[system](texts, work.tokens))
        log.info("%d cancels through wschat, %d direct", work.cancels, work.cancels)
        waits = asyncio.run(gateway_cancels(gateway.ws_url, slots_url, story(0), work.cancels))
        closes = asyncio.run(direct_cancels(direct, slots_url, story(0), work.cancels))
    figures = {s: {n: figures_of(r) for n, r in by_n.items()} for s, by_n in rounds.items()}
    for wait, close in zip(waits, closes, strict=True):
        wait["direct_idle_s"] = close
    return {
        "workload": dataclasses.asdict(work),
        "engine": engine,
        "threads": threads,
        "engine_cores": sorted(engine_cores),
        "front_cores": sorted(front_cores),
        "slots": slots,
        "xllamacpp": getattr(xllamacpp, "__version__", "?"),
        "figures": figures,
        "compared": compare(figures),
        "cancel": cancel_summary(waits),
        "cancel_waits": waits,
    }
