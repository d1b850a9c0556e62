"""Past the batch width: 8, 16 and 32 concurrent sessions against wschat servers whose batch width
(``--max-concurrent``) is 8, 16 and 32.

The servers run side by side (an idle one takes no CPU) and each round measures every width at
every session count back to back, the order of the widths reversed every other round, so a drift
of a shared machine's load hits them alike; each figure is the median over rounds. Per cell:
aggregate tokens/s, TTFT p50 and p95 (from the prompt's send, so a queued session's wait is in
it), the queue wait the server reports (``start.queued_ms``), and whether the sessions that had to
wait started in the order they arrived (FIFO, PROTOCOL.md "Server frames": ``queued``).

Arrival order is the server's own: the place the first ``queued`` frame gave each session that
had to wait (the sessions granted a slot at once arrived before all of them). Start order is when
each ``start`` frame came; ``start`` frames the server sends in one pass of its loop may reach the
load generator in any order, so starts within ``TIE_S`` of each other count as together.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import procs, wsload
from .figures import Column, Section, Table, Target, at_least, at_most
from .llamacpp import paired_ratio
from .stats import StreamTimes, figures_over_rounds, median, percentile
from .workload import story

log = logging.getLogger("bench.widths")

WIDTHS = (8, 16, 32)
SESSIONS = (8, 16, 32)
TIE_S = 0.010  # starts closer than this are not told apart (see the module docstring)
NO_COLLAPSE = 1.0  # issue 15: aggregate at the most sessions >= this x at the fewest

Served = list[tuple[StreamTimes, dict[str, Any]]]  # wsload.served: each stream and its frames


@dataclass(frozen=True, slots=True)
class WidthsWork:
    tokens: int = 64
    rounds: int = 3
    widths: tuple[int, ...] = WIDTHS
    sessions: tuple[int, ...] = SESSIONS

    @classmethod
    def quick(cls) -> WidthsWork:
        return cls(tokens=16, rounds=1)


# -- the arithmetic ---------------------------------------------------------------------------


def fifo(served: Served, tie_s: float = TIE_S) -> dict[str, Any]:
    """Pairs of sessions where one arrived before the other, and how many of them started in the
    other order (by more than ``tie_s``). ``judged`` is False when the places the queue gave are
    not 1..k (a slot came free while the prompts arrived, so places do not order arrivals)."""
    arrivals = [(_place(frames), frames["start_at"]) for _, frames in served]
    places = sorted(p for p, _ in arrivals if p > 0)
    pairs = out_of_order = 0
    for first_place, first_start in arrivals:
        for place, start in arrivals:
            if place > first_place and place > 0:
                pairs += 1
                out_of_order += start + tie_s < first_start
    return {
        "queued": len(places),
        "pairs": pairs,
        "out_of_order": out_of_order,
        "judged": places == list(range(1, len(places) + 1)),
    }


def _place(frames: dict[str, Any]) -> int:
    """The place in the queue a session first got; 0 when a slot was free at once."""
    positions = frames.get("positions") or [0]
    return int(positions[0])


def queue_waits(served: Served) -> list[float]:
    """Each session's wait for a slot as the server measured it (s)."""
    return [frames["queued_ms"] / 1000 for _, frames in served]


def cell(rounds: list[Served]) -> dict[str, Any]:
    """One width at one session count: the usual figures, the queue wait (median over rounds of
    each round's p50 and p95) and FIFO over every round."""
    orders = [fifo(r) for r in rounds]
    waits = [queue_waits(r) for r in rounds]
    return {
        **figures_over_rounds([[times for times, _ in r] for r in rounds]),
        "queue_p50_s": median([median(w) for w in waits]),
        "queue_p95_s": median([percentile(w, 95) for w in waits]),
        "fifo": {
            "queued": max(o["queued"] for o in orders),
            "pairs": sum(o["pairs"] for o in orders),
            "out_of_order": sum(o["out_of_order"] for o in orders),
            "judged": all(o["judged"] for o in orders),
        },
    }


def growth(figures: dict[int, dict[int, dict[str, Any]]]) -> dict[int, float]:
    """Per width: aggregate tokens/s at the most sessions over at the fewest, round by round."""
    out = {}
    for width, by_n in figures.items():
        few, most = by_n[min(by_n)], by_n[max(by_n)]
        out[width] = paired_ratio(most["aggregate_tps_rounds"], few["aggregate_tps_rounds"])
    return out


def best_width(figures: dict[int, dict[int, dict[str, Any]]]) -> dict[int, int]:
    """Per session count: the width with the highest aggregate tokens/s."""
    counts = sorted({n for by_n in figures.values() for n in by_n})
    return {
        n: max(figures, key=lambda w: figures[w][n]["aggregate_tps"] if n in figures[w] else 0.0)
        for n in counts
    }


def targets(result: dict[str, Any]) -> list[Target]:
    """Per width: no collapse past the width; and FIFO held in every cell."""
    figures, rows = result["figures"], []
    for width, ratio in result["growth"].items():
        by_n = figures[width]
        few, most = min(by_n), max(by_n)
        rows.append(
            Target.judged(
                f"width {width}: {most} sessions agg >= {NO_COLLAPSE} x {few} sessions",
                value=by_n[most]["aggregate_tps"],
                against=by_n[few]["aggregate_tps"],
                ratio=ratio,
                limit=at_least(NO_COLLAPSE),
            )
        )
    orders = [f["fifo"] for by_n in figures.values() for f in by_n.values()]
    wrong = sum(o["out_of_order"] for o in orders)
    pairs = sum(o["pairs"] for o in orders)
    fifo = Target.judged(
        "widths: queued sessions start in arrival order (pairs out of order)",
        value=float(wrong),
        against=float(pairs),
        ratio=float(wrong),
        limit=at_most(0.0, "n"),
        unit="n",
    )
    # not judged where the places the queue gave do not order the arrivals (``fifo``)
    judged = all(o["judged"] for o in orders)
    return [*rows, fifo if judged else dataclasses.replace(fifo, met=None)]


TABLE = (
    Column("width", 6, "n"),
    Column("sessions", 9, "n"),
    Column("agg tok/s", 11),
    Column("vs best", 9, "x"),
    Column("stream tok/s", 14),
    Column("TTFT p50", 10, "ms"),
    Column("TTFT p95", 10, "ms"),
    Column("queue p50", 11, "ms"),
    Column("queue p95", 11, "ms"),
    Column("FIFO", 14),
)


def report(result: dict[str, Any]) -> Section:
    work = result["workload"]
    table = Table(TABLE)
    figures, best = result["figures"], result["best_width"]
    for width, by_n in figures.items():
        for n, f in sorted(by_n.items()):
            top = figures[best[n]][n]["aggregate_tps"]
            table.add(
                width,
                n,
                f["aggregate_tps"],
                f["aggregate_tps"] / top if top else None,
                f["stream_tps"],
                f["ttft_median_s"],
                f["ttft_p95_s"],
                f["queue_p50_s"],
                f["queue_p95_s"],
                _fifo_cell(f["fifo"]),
            )
    return Section(
        [
            f"past the batch width: wschat --engine {result['engine']} with --max-concurrent "
            f"{'/'.join(str(w) for w in work['widths'])} side by side; {work['tokens']} tokens "
            f"per stream, median of {work['rounds']} rounds;",
            "TTFT from the prompt's send (a queued session's wait in it); queue: "
            "start.queued_ms; FIFO: queued pairs started out of arrival order (by > "
            f"{TIE_S * 1000:.0f} ms)",
            table,
            "best width by sessions: " + ", ".join(f"{n}: {w}" for n, w in sorted(best.items())),
        ],
        targets(result),
    )


def _fifo_cell(order: dict[str, Any]) -> str:
    if not order["queued"]:
        return "none queued"
    if not order["judged"]:
        return "unjudged"
    return f"{order['out_of_order']} of {order['pairs']}"


# -- the measurement --------------------------------------------------------------------------


def run(work: WidthsWork, logs: Path, engine: str = "batched") -> dict[str, Any]:
    logs.mkdir(parents=True, exist_ok=True)
    rounds: dict[int, dict[int, list[Served]]] = {
        w: {n: [] for n in work.sessions} for w in work.widths
    }
    connections = 2 * max(work.sessions)
    with contextlib.ExitStack() as stack:
        servers = {}
        for width in work.widths:
            log.info("starting wschat --engine %s --max-concurrent %d", engine, width)
            extra = ("--max-concurrent", str(width), "--max-queue", str(connections))
            servers[width] = stack.enter_context(
                procs.wschat(engine, logs, connections, extra, name=f"wschat-width-{width}")
            )
        for server in servers.values():  # warm-up: every batch each cell will run
            for n in work.sessions:
                _serve(server.ws_url, n, 4)
        for r in range(work.rounds):
            order = work.widths if r % 2 == 0 else work.widths[::-1]
            for n in work.sessions:
                log.info("round %d: %d sessions, widths %s", r + 1, n, order)
                for width in order:
                    rounds[width][n].append(_serve(servers[width].ws_url, n, work.tokens))
    figures = {w: {n: cell(r) for n, r in by_n.items()} for w, by_n in rounds.items()}
    return {
        "workload": dataclasses.asdict(work),
        "engine": engine,
        "figures": figures,
        "growth": growth(figures),
        "best_width": best_width(figures),
    }


def _serve(url: str, sessions: int, tokens: int) -> Served:
    return asyncio.run(wsload.served(url, [story(i) for i in range(sessions)], tokens))
