"""The llama.cpp scenario: wschat's own engine in process, wschat in front of llama.cpp's server
(``--engine llamacpp``, which starts and supervises one, and ``--engine openai`` pointed at one),
and llama.cpp's server answered directly, on the embedded Gemma 3 270M (llama.cpp's Q4_K_M GGUF,
ours converted from it), the same prompts, greedy.

"Direct" is what a client that knows nothing of wschat sends: ``/v1/completions`` with the
prompt as text, ``max_tokens``, ``temperature`` 0 and ``stream``; everything else is llama.cpp's
default. Two layouts of the cores:

- ``shared``: every process on every core, as on a laptop; llama.cpp and our engine each take as
  many threads as there are cores. Our in-process engine is measured here, with the default
  ``--dtype`` and with the one ``auto`` picked before packed weights (``before_dtype``);
- ``split``: llama.cpp on the first cores, wschat and the load generator on the last, as where
  the engine has a machine of its own.

Every round measures every system of a layout back to back at each stream count (the order
alternates from round to round), so a drift of the machine's load hits them alike; each ratio is
the median of round-by-round ratios. Then cancels, in the split layout: a reply cancelled
through ``--engine openai``, timed to its ``done`` and to the moment llama.cpp's ``/slots``
shows no slot processing, and a stream closed directly.
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
from .figures import Column, Section, Table, Target, at_least, at_most
from .render import figure
from .stats import Concurrent, StreamTimes, figures_over_rounds, median, percentile
from .workload import story

log = logging.getLogger("bench.llamacpp")

DIRECT = "llama.cpp direct"
VIA_LLAMACPP = "wschat --engine llamacpp"
VIA_OPENAI = "wschat --engine openai"
PEER = "llama.cpp-server"  # the peer row of the main run (bench/run.py)
SHARED, SPLIT = "shared", "split"
FRONTS = (VIA_LLAMACPP, VIA_OPENAI)
JUDGED = (1, 8)  # the stream counts the targets hold
FRONT_RATIO = 0.95  # wschat in front: aggregate tokens/s over llama.cpp direct's
FRONT_TTFT_LIMIT_S = 0.015  # wschat in front, split layout: TTFT over llama.cpp direct's
# our in-process engine against llama.cpp direct (shared layout): aggregate tokens/s at 1 and 8
# streams, and one stream's median TTFT as a ratio
IN_PROCESS_RATIO = {1: 0.6, 8: 1.0}
IN_PROCESS_TTFT_X = 2.5
OVER_BEFORE = 2.5  # one stream: the default dtype over the one auto picked before
SLOT_CONTEXT = 1024  # KV tokens per llama.cpp slot: a prompt and its reply fit many times
POLL_S = 0.002  # /slots polling while waiting for idle
IDLE_TIMEOUT_S = 10.0
TIMEOUT = 600.0
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True, slots=True)
class LlamaWork:
    tokens: int = 64
    streams: tuple[int, ...] = (1, 4, 8)
    rounds: int = 3
    cancels: int = 10
    inprocess: bool = True  # our in-process engine as rows of the shared layout
    layouts: tuple[str, ...] = (SHARED, SPLIT)

    @classmethod
    def quick(cls) -> LlamaWork:
        return cls(tokens=16, rounds=1, cancels=3)


def layout_cores(layout: str) -> tuple[set[int], set[int]]:
    """(llama.cpp's cores, the front's: wschat and the load generator) in ``layout``."""
    usable = sorted(os.sched_getaffinity(0))
    if layout == SHARED or len(usable) < 2:
        return set(usable), set(usable)
    return set(usable[:-1]), {usable[-1]}


def before_dtype() -> str:
    """What ``--dtype auto`` picked on this CPU before packed weights: bf16 where the CPU has
    bf16 instructions, else float32."""
    try:
        flags = CPUINFO.read_text()
    except OSError:
        return "float32"
    return "bfloat16" if any(f in flags for f in ("avx512_bf16", "amx_bf16")) else "float32"


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
    return {
        **figures_over_rounds(rounds),
        "ttft_rounds": [Concurrent.of(r).ttft_median for r in rounds],
    }


def compare(
    figures: dict[str, dict[int, dict[str, Any]]], against: str = DIRECT
) -> dict[str, dict[int, Any]]:
    """Each system against ``against`` at each stream count: aggregate tokens/s as a ratio,
    median TTFT as a difference in seconds and as a ratio."""
    base = figures[against]
    out: dict[str, dict[int, Any]] = {}
    for system, by_n in figures.items():
        out[system] = {}
        for n, f in by_n.items():
            agg, ttft = f["aggregate_tps_rounds"], f["ttft_rounds"]
            out[system][n] = {
                "aggregate_x": paired_ratio(agg, base[n]["aggregate_tps_rounds"]),
                "ttft_diff_s": paired_difference(ttft, base[n]["ttft_rounds"]),
                "ttft_x": paired_ratio(ttft, base[n]["ttft_rounds"]),
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


def _streams(n: int) -> str:
    return "1 stream" if n == 1 else f"{n} streams"


def targets(result: dict[str, Any]) -> list[Target]:
    """In front of llama.cpp (both layouts): aggregate tokens/s within FRONT_RATIO of direct,
    and in the split layout TTFT within FRONT_TTFT_LIMIT_S; in process (shared layout): the
    ratios of IN_PROCESS_RATIO, TTFT within IN_PROCESS_TTFT_X, and OVER_BEFORE the dtype auto
    picked before packed weights."""
    rows: list[Target] = []
    for layout, run in result["layouts"].items():
        rows += _front_targets(layout, run)
        if run.get("inprocess") in run["figures"]:
            rows += _in_process_targets(layout, run)
    return rows


def _front_targets(layout: str, run: dict[str, Any]) -> list[Target]:
    figures, compared = run["figures"], run["compared"]
    direct, rows = figures[DIRECT], []
    for system in FRONTS:
        for n in JUDGED:
            if n not in figures.get(system, {}):
                continue
            ours, c = figures[system][n], compared[system][n]
            rows.append(
                Target.judged(
                    f"{layout}, {_streams(n)}: {system} agg >= {FRONT_RATIO} x direct",
                    value=ours["aggregate_tps"],
                    against=direct[n]["aggregate_tps"],
                    ratio=c["aggregate_x"],
                    limit=at_least(FRONT_RATIO),
                )
            )
            if layout == SPLIT:
                rows.append(
                    Target.judged(
                        f"{layout}, {_streams(n)}: {system} TTFT <= direct + "
                        f"{FRONT_TTFT_LIMIT_S * 1000:.0f} ms",
                        value=ours["ttft_median_s"],
                        against=direct[n]["ttft_median_s"],
                        ratio=c["ttft_diff_s"],
                        limit=at_most(FRONT_TTFT_LIMIT_S, "ms"),
                        unit="ms",
                    )
                )
    return rows


def _in_process_targets(layout: str, run: dict[str, Any]) -> list[Target]:
    figures, compared, local = run["figures"], run["compared"], run["inprocess"]
    direct, rows = figures[DIRECT], []
    for n, limit in IN_PROCESS_RATIO.items():
        if n in figures[local]:
            rows.append(
                Target.judged(
                    f"{layout}, {_streams(n)}: in process agg >= {limit} x llama.cpp",
                    value=figures[local][n]["aggregate_tps"],
                    against=direct[n]["aggregate_tps"],
                    ratio=compared[local][n]["aggregate_x"],
                    limit=at_least(limit),
                )
            )
    rows.append(
        Target.judged(
            f"{layout}, 1 stream: in process TTFT <= {IN_PROCESS_TTFT_X} x llama.cpp's",
            value=figures[local][1]["ttft_median_s"],
            against=direct[1]["ttft_median_s"],
            ratio=compared[local][1]["ttft_x"],
            limit=at_most(IN_PROCESS_TTFT_X),
            unit="ms",
        )
    )
    before: str = run.get("before", "")  # "": no row before ran
    rss = run.get("rss_mb", {})
    if before in rss:
        target = f"{layout}: in process RSS <= {run['before_dtype']}'s (same streams)"
        rows.append(rss_target(target, rss, local, before, 1.0))
    if before in figures:
        now, then = figures[local][1], figures[before][1]
        rows.append(
            Target.judged(
                f"{layout}, 1 stream: {run['dtype']} >= {OVER_BEFORE} x {run['before_dtype']}",
                value=now["aggregate_tps"],
                against=then["aggregate_tps"],
                ratio=paired_ratio(now["aggregate_tps_rounds"], then["aggregate_tps_rounds"]),
                limit=at_least(OVER_BEFORE),
            )
        )
    return rows


def rss_target(target: str, rss: dict[str, float], now: str, before: str, limit: float) -> Target:
    """The RSS of the server ``now`` over that of the one ``before`` it, which served the same
    streams: at most ``limit``."""
    return Target.over(target, value=rss[now], against=rss[before], limit=at_most(limit), unit="MB")


def compared_rows(run: dict[str, Any]) -> Iterator[tuple[str, int, dict[str, Any], Any]]:
    """Each system of a run at each stream count, fewest first: its figures and how they
    compare (``compare``)."""
    for system, by_n in run["figures"].items():
        for n, f in sorted(by_n.items()):
            yield system, n, f, run["compared"][system][n]


TABLE = (
    Column("system", 34, left=True),
    Column("streams", 8, "n"),
    Column("agg tok/s", 11),
    Column("stream tok/s", 13),
    Column("TTFT med", 10, "ms"),
    Column("TTFT p95", 10, "ms"),
    Column("agg vs direct", 15, "x"),
    Column("TTFT - direct", 15, "ms"),
)


def report(result: dict[str, Any]) -> Section:
    work = result["workload"]
    out = Section(
        [
            f"llama.cpp's server (xllamacpp {result.get('xllamacpp', '?')}) on the embedded "
            f"GGUF, {result['slots']} slots; {work['tokens']} tokens per stream, greedy, median "
            f"of {work['rounds']} rounds; ratios and differences to llama.cpp direct (its plain "
            "default request), round by round",
        ],
        targets(result),
    )
    for layout, run in result["layouts"].items():
        table = Table(TABLE)
        for system, n, f, c in compared_rows(run):
            table.add(
                system,
                n,
                f["aggregate_tps"],
                f["stream_tps"],
                f["ttft_median_s"],
                f["ttft_p95_s"],
                c["aggregate_x"],
                c["ttft_diff_s"],
            )
        out.parts += [
            "",
            f"{layout}: llama.cpp {run['threads']} threads on cores {run['engine_cores']}; "
            f"wschat and the load generator on cores {run['front_cores']}",
            table,
        ]
        if run.get("rss_mb"):
            rss = ", ".join(f"{system} {mb:.0f} MB" for system, mb in run["rss_mb"].items())
            out.parts.append(f"RSS after the rounds: {rss}")
    c = result.get("cancel")
    if c:
        parts = [
            f"{label} median {figure(c[key]['median_s'], 'ms')}, p95 "
            f"{figure(c[key]['p95_s'], 'ms')}"
            for key, label in (
                ("done_s", "cancel to done"),
                ("idle_s", "cancel to slot idle"),
                ("direct_idle_s", "direct close to slot idle"),
            )
            if key in c
        ]
        out.parts.append(
            f"cancels through {VIA_OPENAI}, split layout ({c['count']}x, read from llama.cpp's "
            "/slots): " + "; ".join(parts)
        )
    return out


# -- llama.cpp spoken to directly -------------------------------------------------------------


def turn_text(text: str) -> str:
    """The first turn of a conversation in Gemma's turn markup, as the prompt text a client
    sends; llama.cpp adds ``<bos>`` and reads the markup as its control tokens, which gives the
    ids wschat renders for the same turn (``--prompt-format gemma-turns``)."""
    return f"<start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n"


def plain_body(text: str, tokens: int) -> dict[str, Any]:
    return {"prompt": turn_text(text), "max_tokens": tokens, "temperature": 0, "stream": True}


def _tokens_in(chunk: dict[str, Any]) -> int:
    """Tokens one streamed chunk carries: one per choice that is not the closing one."""
    return sum(1 for choice in chunk.get("choices") or () if choice.get("finish_reason") is None)


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
    """llama.cpp's server answering the plain request (``plain_body``)."""

    def __init__(self, base: str) -> None:
        self.url = f"{base}/v1/completions"

    def streams(self, texts: list[str], tokens: int) -> list[StreamTimes]:
        return asyncio.run(direct_concurrent(self.url, [plain_body(t, tokens) for t in texts]))


@contextlib.contextmanager
def peer(
    logs: Path, slots: int, threads: int
) -> Iterator[Callable[[list[str], int], list[StreamTimes]]]:
    """llama.cpp's server as a peer row of the main run: ``threads`` threads on the cores the
    rest of the run shares, ``slots`` slots, answering the plain request; warmed up at
    ``slots`` streams (its first use of a slot is slow)."""
    with procs.llama_cpp(threads, slots, SLOT_CONTEXT, logs) as llama:
        direct = Direct(llama.base)
        direct.streams([story(i) for i in range(slots)], 4)
        yield direct.streams


# -- cancels ----------------------------------------------------------------------------------


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
    async with wsload.session(ws_url) as peer, httpx.AsyncClient(timeout=10) as http:
        for i in range(count):
            sent, done_s = await wsload.cancelled_mid_stream(peer, f"c{i}", text, 500, after_tokens)
            idle = await _idle_after(http, slots_url, sent)
            waits.append({"done_s": done_s, "idle_s": idle})
            await wsload.reset(peer, f"r{i}")
    return waits


async def direct_cancels(
    direct: Direct, slots_url: str, text: str, count: int, after_tokens: int = 4
) -> list[float]:
    """Close a direct stream mid-reply: seconds until llama.cpp's slot is idle."""
    waits = []
    body = plain_body(text, 500)
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


# -- the run ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _pinned(cores: set[int]) -> Iterator[None]:
    """This process on ``cores`` while in the block."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def ws_streams(url: str, sampled: bool = False) -> Callable[[list[str], int], list[StreamTimes]]:
    return lambda texts, tokens: asyncio.run(wsload.concurrent(url, texts, tokens, sampled))


def run_layout(
    work: LlamaWork, logs: Path, layout: str, engine: str, stack: contextlib.ExitStack
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start every system of ``layout`` (in ``stack``), measure them round by round; (the
    layout's result, what the cancels need)."""
    engine_cores, front_cores = layout_cores(layout)
    threads, slots = len(engine_cores), max(work.streams)
    stack.enter_context(_pinned(front_cores))  # the load generator
    log.info(
        "%s: llama.cpp's server, %d threads on cores %s, %d slots; wschat and the load "
        "generator on cores %s",
        layout,
        threads,
        sorted(engine_cores),
        slots,
        sorted(front_cores),
    )
    llama = stack.enter_context(
        procs.llama_cpp(threads, slots, SLOT_CONTEXT, logs, cores=engine_cores, name=layout)
    )
    direct = Direct(llama.base)
    measure: dict[str, Callable[[list[str], int], list[StreamTimes]]] = {DIRECT: direct.streams}
    log.info("%s: wschat --engine llamacpp, its llama.cpp on cores %s", layout, engine_cores)
    own = stack.enter_context(
        procs.wschat_llamacpp(
            threads, slots, SLOT_CONTEXT, logs, front_cores, engine_cores, f"llamacpp-{layout}"
        )
    )
    measure[VIA_LLAMACPP] = ws_streams(own.ws_url)
    log.info("%s: wschat --engine openai in front of the first", layout)
    gateway_args = ("--engine-url", f"{llama.base}/v1", "--tokenizer", "embedded")
    gateway = stack.enter_context(
        procs.wschat(
            "openai", logs, 64, gateway_args, name=f"wschat-openai-{layout}", cores=front_cores
        )
    )
    measure[VIA_OPENAI] = ws_streams(gateway.ws_url)
    out: dict[str, Any] = {
        "threads": threads,
        "engine_cores": sorted(engine_cores),
        "front_cores": sorted(front_cores),
    }
    if work.inprocess and layout == SHARED:
        local, before = f"wschat in process ({engine})", f"wschat in process, {before_dtype()}"
        log.info("%s: wschat --engine %s --threads %d, default dtype and --dtype %s",
                 layout, engine, threads, before_dtype())  # fmt: skip
        server = stack.enter_context(
            procs.wschat(engine, logs, 64, ("--threads", str(threads)), name=f"wschat-{engine}")
        )
        old = stack.enter_context(
            procs.wschat(
                engine, logs, 64, ("--threads", str(threads), "--dtype", before_dtype()),
                name=f"wschat-{engine}-{before_dtype()}",
            )
        )  # fmt: skip
        measure[local], measure[before] = ws_streams(server.ws_url), ws_streams(old.ws_url)
        out |= {"inprocess": local, "before": before, "before_dtype": before_dtype()}
        out["dtype"] = dtype_of(server.base)
    systems = list(measure)
    rounds: dict[str, dict[int, list[list[StreamTimes]]]] = {
        s: {n: [] for n in work.streams} for s in systems
    }
    # warm-up at the widest count: llama.cpp's first use of a slot is slow (2.9 s to the first
    # token of 8 fresh slots, 0.1 s after), and whoever came first would pay it
    for system in systems:
        measure[system]([story(i) for i in range(slots)], 4)
    for r in range(work.rounds):
        order = systems if r % 2 == 0 else systems[::-1]
        for n in work.streams:
            texts = [story(i) for i in range(n)]
            log.info("%s, round %d: %d streams: %s", layout, r + 1, n, ", ".join(order))
            for system in order:
                rounds[system][n].append(measure[system](texts, work.tokens))
    figures = {s: {n: figures_of(r) for n, r in by_n.items()} for s, by_n in rounds.items()}
    out |= {"figures": figures, "compared": compare(figures)}
    if "inprocess" in out:  # both served the same streams: their weights and KV buffers
        out["rss_mb"] = {out["inprocess"]: server.rss() / 2**20, out["before"]: old.rss() / 2**20}
    return out, {"gateway": gateway.ws_url, "slots": f"{llama.base}/slots", "direct": direct}


def dtype_of(base: str) -> str:
    """The precision a server runs (its /readyz says)."""
    return str(httpx.get(f"{base}/readyz", timeout=10).json().get("dtype", "?"))


def run(work: LlamaWork, logs: Path, engine: str = "batched") -> dict[str, Any]:
    import xllamacpp

    logs.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "workload": dataclasses.asdict(work),
        "engine": engine,
        "slots": max(work.streams),
        "xllamacpp": getattr(xllamacpp, "__version__", "?"),
        "layouts": {},
    }
    for layout in work.layouts:
        with contextlib.ExitStack() as stack:
            result["layouts"][layout], parts = run_layout(work, logs, layout, engine, stack)
            if layout != SPLIT or not work.cancels:
                continue
            log.info("%d cancels through wschat, %d direct", work.cancels, work.cancels)
            waits = asyncio.run(
                gateway_cancels(parts["gateway"], parts["slots"], story(0), work.cancels)
            )
            closes = asyncio.run(
                direct_cancels(parts["direct"], parts["slots"], story(0), work.cancels)
            )
            for wait, close in zip(waits, closes, strict=True):
                wait["direct_idle_s"] = close
            result["cancel"] = cancel_summary(waits)
            result["cancel_waits"] = waits
    return result
