"""The host classes scenario (``python -m bench --only classes``): our in-process engine under
each x86 class this host can stand in for (bench/hostclass.py: AMX, AVX512-BF16 without AMX,
AVX2), each with ``--dtype auto`` and with the dtype ``auto`` picked there before the int8 head,
against llama.cpp's server on the same GGUF (which no variable caps: the same server in every
class), the same prompts in Gemma's turn markup, greedy, 2 threads each, all on every core.

One class at a time: its servers and llama.cpp's are measured back to back at each stream
count in each round (the order alternating), so a drift of the machine's load hits them alike;
each ratio is the median of round-by-round ratios (bench/llamacpp.py's arithmetic).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import hostclass, llamacpp, procs
from .figures import Column, Section, Table, Target, at_least, at_most
from .stats import StreamTimes
from .workload import story

log = logging.getLogger("bench.classes")

LLAMA = "llama.cpp server"
SAMPLED = " sampled"  # the auto server's name and this: its default sampling, one stream
STATIC = "static batch in process"  # transformers' generate over 8 rows: the native class's
# what --dtype auto picked on each class before the int8 head: the "before" row
BEFORE = {
    hostclass.AMX: "bf16-packed",
    hostclass.AVX512_BF16: "fp16-weights",
    hostclass.AVX2: "fp16-weights",
}
# the class's int8 paths, each a row beside auto's (but the one auto picks: its row is auto's)
INT8 = {
    hostclass.AMX: ("bf16-int8", "bf16-int8head"),
    hostclass.AVX512_BF16: ("fp16-int8", "fp16-int8head"),
    hostclass.AVX2: ("fp16-int8", "fp16-int8head"),
}
START_TIMEOUT_S = 1200.0  # a first start compiles the int8 head's kernel (minutes when busy)
# issue 34's targets for the auto row against llama.cpp: aggregate tokens/s (at least) by
# streams, one stream's median TTFT (at most), RSS over the row before (at most)
AGGREGATE_X = {1: 1.0, 8: 1.3}
TTFT_X = 1.5
RSS_X = 1.1
SAMPLED_X = 0.95  # default sampling's one stream against greedy's (at least)
STATIC_P95_X = 1.2  # 8 sessions' TTFT p95 over the in-process static batch's (at most)


@dataclass(frozen=True, slots=True)
class ClassesWork:
    tokens: int = 64
    streams: tuple[int, ...] = (1, 8)
    rounds: int = 3
    threads: int = 2
    classes: tuple[str, ...] = ()  # all this host can stand in for

    @classmethod
    def quick(cls) -> ClassesWork:
        return cls(tokens=16, rounds=1)


def _row(host_class: str, dtype: str) -> str:
    return f"wschat {host_class} --dtype {dtype}"


def run(work: ClassesWork, logs: Path, engine: str = "batched") -> dict[str, Any]:
    logs.mkdir(parents=True, exist_ok=True)
    slots = max(work.streams)
    result: dict[str, Any] = {"workload": dataclasses.asdict(work), "engine": engine}
    result["classes"] = {}
    with procs.llama_cpp(work.threads, slots, llamacpp.SLOT_CONTEXT, logs) as llama:
        direct = llamacpp.Direct(llama.base)
        for host_class in work.classes or tuple(hostclass.available()):
            log.info("class %s: %s", host_class, hostclass.CLASSES[host_class] or "as it is")
            result["classes"][host_class] = _run_class(work, logs, engine, host_class, direct)
    result["load_average_at_end"] = os.getloadavg()
    return result


def _static_batch(threads: int) -> Callable[[list[str], int], list[StreamTimes]]:
    """transformers' ``generate`` over all the prompts at once in this process (the embedded
    model as ``auto`` loads it here, on this host's own class), ``threads`` torch threads."""
    import torch

    from .inprocess import InProcess

    torch.set_num_threads(threads)
    local = InProcess.load()
    local.loaded.prepare(8)  # the int8 head compiled for the batch, as the engines have it
    return local.static


def _run_class(
    work: ClassesWork, logs: Path, engine: str, host_class: str, direct: llamacpp.Direct
) -> dict[str, Any]:
    env = hostclass.CLASSES[host_class]
    dtypes = ["auto", *INT8[host_class], BEFORE[host_class]]
    with contextlib.ExitStack() as stack:
        servers: dict[str, procs.Running] = {}
        picked: dict[str, str] = {}  # each server's dtype, as its /readyz says
        for dtype in dtypes:
            if dtype in picked.values():
                continue  # auto's pick: auto's row is its figures
            extra: tuple[str, ...] = ("--threads", str(work.threads), "--dtype", dtype)
            # auto's server at info: its start-up line says which dtype and why (_dtype_line)
            extra += ("--log-level", "info") if dtype == "auto" else ()
            row = _row(host_class, dtype)
            servers[row] = stack.enter_context(
                procs.wschat(
                    engine, logs, 64, extra,
                    name=f"wschat-{host_class}-{dtype}", env=env, timeout_s=START_TIMEOUT_S,
                )
            )  # fmt: skip
            picked[row] = llamacpp.dtype_of(servers[row].base)
        measure: dict[str, Callable[[list[str], int], list[StreamTimes]]] = {
            name: llamacpp.ws_streams(server.ws_url) for name, server in servers.items()
        }
        auto = _row(host_class, "auto")
        measure[auto + SAMPLED] = llamacpp.ws_streams(servers[auto].ws_url, sampled=True)
        measure[LLAMA] = direct.streams
        only = {auto + SAMPLED: 1}
        if not env:  # this process runs on the host's own class: the static batch beside
            measure[STATIC], only[STATIC] = _static_batch(work.threads), max(work.streams)
        figures = _rounds(work, measure, only)
        rss = {name: server.rss() / 2**20 for name, server in servers.items()}
        auto_log = servers[auto].log.read_text(errors="replace")
    return {
        "env": env,
        "dtype": picked,
        "auto_said": _dtype_line(auto_log),
        "auto": _row(host_class, "auto"),
        "before": _row(host_class, dtypes[-1]),
        "figures": figures,
        "compared": llamacpp.compare(figures, against=LLAMA),
        "rss_mb": rss,
    }


def _dtype_line(log_text: str) -> str:
    """The server's start-up line saying which dtype it runs and why (``--dtype auto``)."""
    said = re.search(r"dtype \S+: auto: .*", log_text)
    return said.group(0) if said else ""


def _rounds(
    work: ClassesWork,
    measure: dict[str, Callable[[list[str], int], list[StreamTimes]]],
    only: dict[str, int],
) -> dict[str, dict[int, dict[str, Any]]]:
    """Each system at each stream count (a system of ``only`` at its one count alone), round
    by round, the order reversed every other round."""
    systems = list(measure)
    for system in systems:  # warm-up at the widest count (llama.cpp's first slots are slow)
        measure[system]([story(i) for i in range(max(work.streams))], 4)
    counts = {s: [n for n in work.streams if only.get(s, n) == n] for s in systems}
    rounds: dict[str, dict[int, list[list[StreamTimes]]]] = {
        s: {n: [] for n in counts[s]} for s in systems
    }
    for r in range(work.rounds):
        order = systems if r % 2 == 0 else systems[::-1]
        for n in work.streams:
            texts = [story(i) for i in range(n)]
            here = [s for s in order if n in counts[s]]
            log.info("round %d: %d streams: %s", r + 1, n, ", ".join(here))
            for system in here:
                rounds[system][n].append(measure[system](texts, work.tokens))
    return {s: {n: llamacpp.figures_of(r) for n, r in by_n.items()} for s, by_n in rounds.items()}


def targets(result: dict[str, Any]) -> list[Target]:
    """Per class, the auto row: aggregate tokens/s over llama.cpp's at AGGREGATE_X, one
    stream's TTFT within TTFT_X of llama.cpp's, RSS within RSS_X of the row before."""
    rows = []
    for host_class, run in result["classes"].items():
        auto, before = run["auto"], run["before"]
        mine, theirs = run["figures"][auto], run["figures"][LLAMA]
        compared = run["compared"][auto]
        for n, limit in AGGREGATE_X.items():
            if n in mine:
                rows.append(
                    Target.judged(
                        f"{host_class}, {n} stream(s): auto agg >= {limit} x llama.cpp",
                        value=mine[n]["aggregate_tps"],
                        against=theirs[n]["aggregate_tps"],
                        ratio=compared[n]["aggregate_x"],
                        limit=at_least(limit),
                    )
                )
        if 1 in mine:
            rows.append(
                Target.judged(
                    f"{host_class}, 1 stream: auto TTFT <= {TTFT_X} x llama.cpp's",
                    value=mine[1]["ttft_median_s"],
                    against=theirs[1]["ttft_median_s"],
                    ratio=compared[1]["ttft_x"],
                    limit=at_most(TTFT_X),
                    unit="ms",
                )
            )
        sampled = run["figures"].get(auto + SAMPLED, {})
        if 1 in sampled and 1 in mine:
            rows.append(
                Target.over(
                    f"{host_class}, 1 stream: default sampling >= {SAMPLED_X} x greedy",
                    value=sampled[1]["stream_tps"],
                    against=mine[1]["stream_tps"],
                    limit=at_least(SAMPLED_X),
                )
            )
        static = run["figures"].get(STATIC, {})
        for n, f in static.items():
            rows.append(
                Target.over(
                    f"{host_class}, {n} sessions: auto TTFT p95 <= {STATIC_P95_X} x the "
                    "static batch's",
                    value=mine[n]["ttft_p95_s"],
                    against=f["ttft_p95_s"],
                    limit=at_most(STATIC_P95_X),
                    unit="ms",
                )
            )
        if before != auto:
            target = f"{host_class}: auto RSS <= {RSS_X} x {run['dtype'][before]}'s (same streams)"
            rows.append(llamacpp.rss_target(target, run["rss_mb"], auto, before, RSS_X))
    return rows


TABLE = (
    Column("class", 12, left=True),
    Column("system", 42, left=True),
    Column("dtype", 15, left=True),
    Column("streams", 8, "n"),
    Column("agg tok/s", 11),
    Column("TTFT med", 10, "ms"),
    Column("TTFT p95", 10, "ms"),
    Column("agg vs llama", 14, "x"),
    Column("TTFT vs llama", 15, "x"),
    Column("RSS", 10, "MB"),
)


def report(result: dict[str, Any]) -> Section:
    work = result["workload"]
    out = Section(
        [
            f"host classes: wschat --engine {result['engine']} --threads {work['threads']} and "
            f"llama.cpp's server ({work['threads']} threads) on the embedded model, "
            f"{work['tokens']} tokens per stream (greedy; '{SAMPLED.strip()}': the server's "
            f"default sampling), {work['rounds']} rounds (order alternating); ratios to "
            "llama.cpp, round by round; the static batch: transformers' generate in the bench's "
            "process on the host's own class",
        ],
        targets(result),
    )
    for host_class, run in result["classes"].items():
        out.parts.append(f"{host_class}: {run.get('auto_said') or 'no dtype line in its log'}")
    table = Table(TABLE)
    for host_class, run in result["classes"].items():
        for system, n, f, c in llamacpp.compared_rows(run):
            dtype = run["dtype"].get(system.removesuffix(SAMPLED), "Q4_K_M")
            dtype = run["dtype"][run["auto"]] if system == STATIC else dtype
            table.add(
                host_class,
                system,
                dtype,
                n,
                f["aggregate_tps"],
                f["ttft_median_s"],
                f["ttft_p95_s"],
                c["aggregate_x"],
                c["ttft_x"],
                run["rss_mb"].get(system),
            )
    out.parts.append(table)
    return out
