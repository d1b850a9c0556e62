"""The run as a table of figures, ratios and the issue's targets (met or missed)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from typing import Any

from . import arrivals, llamacpp
from .figures import Column, Section, Table, Target, above, at_least, at_most
from .render import figure


def _get(result: dict[str, Any], *path: Any) -> Any:
    node: Any = result
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def paired(ours: dict[str, Any], ceiling: dict[str, Any], key: str) -> float:
    """The median of round-by-round ratios: each round ran the ceiling and the server back to
    back, so a drift of the shared machine's load cancels out of each ratio."""
    mine, theirs = ours.get(f"{key}_rounds", []), ceiling.get(f"{key}_rounds", [])
    if mine and len(mine) == len(theirs):
        return float(statistics.median(a / b for a, b in zip(mine, theirs, strict=True)))
    return float(ours[key] / ceiling[key])


def ttft_p95_ratio(ours: dict[str, Any], ceiling: dict[str, Any]) -> float:
    """Our TTFT p95 over the ceiling's: the median of round-by-round ratios (``paired``)."""
    mine, theirs = ours.get("ttft_p95_rounds", []), ceiling.get("ttft_p95_rounds", [])
    if mine and len(mine) == len(theirs):
        return float(statistics.median(a / b for a, b in zip(mine, theirs, strict=True)))
    return float(ours["ttft_p95_s"] / ceiling["ttft_p95_s"])


def turn_ratios(result: dict[str, Any]) -> list[float]:
    """The last turn's TTFT over the first's, in each run of the conversation (both from the
    same run); one ratio of the turns' medians where the runs were not kept."""
    runs = result.get("conversation_runs")
    if runs:
        return [run[-1] / run[0] for run in runs]
    turns = result["conversation"]
    return [turns[-1]["ttft"] / turns[0]["ttft"]]


def targets(result: dict[str, Any]) -> list[Target]:
    """Each target of issue 5 (and the staggered arrivals'): what we measured, against what,
    and whether it is met."""
    ours = result[f"wschat-{result['engine']}"]
    top = max(ours)
    ceil = result["ceiling"]
    peer_cb = _get(result, "peers", "transformers-serve-cb", top)
    turns, ratios = result["conversation"], turn_ratios(result)
    cancel, memory = result["cancel"], result["memory"]
    one, many = ours[1], ours[top]
    out = [
        Target.judged(
            "one stream tokens/s >= 0.95 x in-process",
            value=one["stream_tps"],
            against=ceil[1]["stream_tps"],
            ratio=paired(one, ceil[1], "stream_tps"),
            limit=at_least(0.95),
        ),
        Target.judged(
            "one stream TTFT <= in-process + 15 ms",
            value=one["ttft_median_s"],
            against=ceil[1]["ttft_median_s"],
            ratio=one["ttft_median_s"] - ceil[1]["ttft_median_s"],
            limit=at_most(0.015, "ms"),
            unit="ms",
        ),
        Target.judged(
            f"{top} sessions aggregate >= 0.9 x static batch",
            value=many["aggregate_tps"],
            against=ceil[top]["aggregate_tps"],
            ratio=paired(many, ceil[top], "aggregate_tps"),
            limit=at_least(0.9),
        ),
        Target.judged(
            f"{top} sessions aggregate > transformers serve --c-b",
            value=many["aggregate_tps"],
            against=peer_cb["aggregate_tps"] if peer_cb else None,
            ratio=paired(many, peer_cb, "aggregate_tps") if peer_cb else None,
            limit=above(1.0),
        ),
        Target.judged(
            f"{top} sessions TTFT p95 <= 1.2 x static batch's",
            value=many["ttft_p95_s"],
            against=ceil[top]["ttft_p95_s"],
            ratio=ttft_p95_ratio(many, ceil[top]),
            limit=at_most(1.2),
            unit="ms",
        ),
        Target.judged(
            f"turn {len(turns)} TTFT <= 1.3 x turn 1 (median of {len(ratios)} runs)",
            value=turns[-1]["ttft"],
            against=turns[0]["ttft"],
            ratio=statistics.median(ratios),
            limit=at_most(1.3),
            unit="ms",
        ),
        Target.judged(
            "cancel to done p95 <= one decode step + 30 ms",
            value=cancel["p95_s"],
            against=cancel["decode_step_s"],
            ratio=cancel["p95_s"] - cancel["decode_step_s"],
            limit=at_most(0.030, "ms"),
            unit="ms",
        ),
        Target.judged(
            f"{memory['sessions']} idle sessions <= 50 MB more RSS",
            value=memory["rss_idle_mb"],
            against=memory["rss_none_mb"],
            ratio=memory["delta_mb"],
            limit=at_most(50.0, "MB"),
            unit="MB",
        ),
    ]
    if "arrivals" in result:
        out += arrivals.targets(result["arrivals"])
    return out


def sections(
    result: dict[str, Any], scenarios: Mapping[str, Callable[[dict[str, Any]], Section]]
) -> list[Section]:
    """A full run: its own section, then the section of each of ``scenarios`` (name: its
    report) that it took in, or why it skipped it."""
    out = [section(result)]
    for name, report_of in scenarios.items():
        if name in result:
            skipped = result[name].get("skipped")
            why = Section([f"no {name} scenario: {skipped}"])
            out.append(why if skipped else report_of(result[name]))
    return out


def section(result: dict[str, Any]) -> Section:
    """The main run: every system at every stream count, the peers, the conversation, the
    staggered arrivals, cancels and idle sessions; its targets."""
    ours_name = f"wschat-{result['engine']}"
    systems = [ours_name, *(k for k in result if k.startswith("wschat-") and k != ours_name)]
    systems += ["ceiling", "transformers-cb-inprocess"]
    peers = result.get("peers", {})
    systems += [k for k in peers if isinstance(peers[k], dict) and "error" not in peers[k]]
    table = Table(SYSTEMS)
    for name in systems:
        figures = result.get(name) or peers.get(name) or {}
        if "error" in figures:
            table.line(f"{name:<30} failed: {figures['error']}")
            continue
        for n, f in sorted(figures.items()):
            ceil = _get(result, "ceiling", n)
            ratio = paired(f, ceil, "aggregate_tps") if ceil else None
            table.add(
                name,
                n,
                f["aggregate_tps"],
                f["stream_tps"],
                f["ttft_median_s"],
                f["ttft_p95_s"],
                f["itl_p95_s"],
                ratio,
            )
    for name, value in peers.items():
        if isinstance(value, str):
            table.line(f"peers: {name}: {value}")
        elif isinstance(value, dict) and "error" in value:
            table.line(f"{name:<30} failed: {value['error']}")
    for line in peer_lines(result):
        table.line(line)
    out = Section([table, ""], targets(result))
    turns = result["conversation"]
    out.parts.append(
        "conversation TTFT by turn (ms): "
        + " ".join(f"{t['ttft'] * 1000:.0f}" for t in turns)
        + "; cached tokens at turn "
        + f"{len(turns)}: {turns[-1]['cached_tokens']} of {turns[-1]['prompt_tokens']}"
    )
    out.parts.append(
        f"turn {len(turns)} / turn 1 in each run: "
        + " ".join(figure(r, "x") for r in turn_ratios(result))
    )
    if "arrivals" in result:
        out.parts += arrivals.lines(result["arrivals"])
    c = result["cancel"]
    out.parts.append(
        f"cancel to done ({c['count']}x): median {figure(c['median_s'], 'ms')}, "
        f"p95 {figure(c['p95_s'], 'ms')}; one decode step {figure(c['decode_step_s'], 'ms')}"
    )
    m = result["memory"]
    out.parts.append(
        f"RSS: {m['rss_none_mb']:.0f} MB with no session, {m['rss_idle_mb']:.0f} MB with "
        f"{m['sessions']} idle sessions (+{m['delta_mb']:.1f} MB)"
    )
    return out


SYSTEMS = (
    Column("system", 30, left=True),
    Column("streams", 8, "n"),
    Column("agg tok/s", 11),
    Column("stream tok/s", 13),
    Column("TTFT med", 10, "ms"),
    Column("TTFT p95", 10, "ms"),
    Column("ITL p95", 9, "ms"),
    Column("vs ceiling", 11, "x"),
)


def peer_lines(result: dict[str, Any]) -> list[str]:
    """llama.cpp's server beside ours, round by round: one stream's decode rate and TTFT, the
    aggregate and TTFT p95 at the most sessions."""
    theirs = _get(result, "peers", llamacpp.PEER)
    if not isinstance(theirs, dict) or "error" in theirs:
        return []
    ours = result[f"wschat-{result['engine']}"]
    top = max(n for n in ours if n in theirs)
    one, many = theirs[1], theirs[top]
    return [
        f"llama.cpp's server / wschat: 1 stream {figure(paired(one, ours[1], 'stream_tps'), 'x')} "
        f"tokens/s, TTFT {figure(one['ttft_median_s'], 'ms')} vs "
        f"{figure(ours[1]['ttft_median_s'], 'ms')}; {top} sessions "
        f"{figure(paired(many, ours[top], 'aggregate_tps'), 'x')} aggregate, TTFT p95 "
        f"{figure(many['ttft_p95_s'], 'ms')} vs {figure(ours[top]['ttft_p95_s'], 'ms')}"
    ]
