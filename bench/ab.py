"""``python -m bench.ab BEFORE AFTER``: two checkouts' servers on the embedded model, measured in
the same run at 1 and 8 streams, in interleaved rounds (each round runs both, the first of the
pair alternating), so a change's figures stand beside its baseline's under the same load.

Each side is a repository checkout with its virtual environment (``.venv/bin/python``); each
server runs ``--engine batched`` from it. The figures per side are the medians over rounds of
each round's figure (``stats.figures_over_rounds``): the 1-stream decode rate and the 8 streams'
aggregate rate, and their ratios AFTER / BEFORE.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

from . import procs, wsload
from .inprocess import PROMPT_FORMAT
from .stats import StreamTimes, figures_over_rounds
from .workload import story

STREAMS = (1, 8)
START_S = 900.0  # a server loads the model and compiles its head first


def server(
    checkout: Path, logs: Path, name: str
) -> contextlib.AbstractContextManager[procs.Running]:
    port = procs.free_port()
    command = [
        str(checkout / ".venv" / "bin" / "python"), "-m", "wschat.server",
        "--model", "embedded",
        "--engine", "batched",
        "--prompt-format", PROMPT_FORMAT,
        "--port", str(port),
        "--ping-interval-s", "0",
        "--log-level", "warning",
    ]  # fmt: skip
    return procs.serving(command, "/readyz", port, logs / f"{name}.log", timeout_s=START_S)


def streams(url: str, n: int, tokens: int) -> list[StreamTimes]:
    return asyncio.run(wsload.concurrent(url, [story(i) for i in range(n)], tokens))


def measure(before: Path, after: Path, rounds: int, tokens: int, logs: Path) -> dict[str, Any]:
    sides = {"before": before, "after": after}
    measured: dict[str, dict[int, list[list[StreamTimes]]]] = {
        side: {n: [] for n in STREAMS} for side in sides
    }
    with contextlib.ExitStack() as stack:
        urls = {
            side: stack.enter_context(server(path, logs, side)).ws_url
            for side, path in sides.items()
        }
        for url in urls.values():
            streams(url, 1, 4)  # warm-up
        for r in range(rounds):
            order = list(urls) if r % 2 == 0 else list(urls)[::-1]
            for n in STREAMS:
                for side in order:
                    measured[side][n].append(streams(urls[side], n, tokens))
    out: dict[str, Any] = {}
    for side, by_n in measured.items():
        one, eight = figures_over_rounds(by_n[1]), figures_over_rounds(by_n[8])
        out[side] = {
            "1_stream_tps": one["stream_tps"],
            "1_stream_ttft_s": one["ttft_median_s"],
            "8_streams_aggregate_tps": eight["aggregate_tps"],
            "8_streams_ttft_median_s": eight["ttft_median_s"],
            "rounds_1": one["stream_tps_rounds"],
            "rounds_8": eight["aggregate_tps_rounds"],
        }
    keys = ("1_stream_tps", "8_streams_aggregate_tps")
    out["ratio"] = {k: out["after"][k] / out["before"][k] for k in keys}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--logs", type=Path, default=Path("/tmp/wschat-bench-ab"))
    args = parser.parse_args()
    result = measure(args.before, args.after, args.rounds, args.tokens, args.logs)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
