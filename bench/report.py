"""The run as a table of figures, ratios and the issue's targets (met or missed)."""

from __future__ import annotations

import math
import statistics
from typing import Any

from . import arrivals, images, llamacpp, resume, threads, widths


def _get(result: dict[str, Any], *path: Any) -> Any:
    node: Any = result
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def figure(value: Any, unit: str = "") -> str:
    """``value`` as the tables print it in ``unit`` ("ms" for seconds, "x", "MB", "n" for a
    count); "-" when it is missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit == "ms":
        return f"{value * 1000:.0f} ms"
    if unit == "x":
        return f"{value:.3f}x"
    if unit == "MB":
        return f"{value:.1f} MB"
    if unit == "n":
        return f"{value:.0f}"
    return f"{value:.1f}"


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


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of issue 5: what we measured, against what, and whether it is met."""
    ours = result[f"wschat-{result['engine']}"]
    top = max(ours)
    ceil = result["ceiling"]
    peer_cb = _get(result, "peers", "transformers-serve-cb", top)
    turns, ratios = result["conversation"], turn_ratios(result)
    cancel, memory = result["cancel"], result["memory"]
    one, many = ours[1], ours[top]
    rows = [
        # target, measured, against, unit of both, ratio or difference, its unit, limit, op
        ("one stream tokens/s >= 0.95 x in-process", one["stream_tps"], ceil[1]["stream_tps"],
         "", paired(one, ceil[1], "stream_tps"), "x", 0.95, ">="),
        ("one stream TTFT <= in-process + 15 ms", one["ttft_median_s"], ceil[1]["ttft_median_s"],
         "ms", one["ttft_median_s"] - ceil[1]["ttft_median_s"], "ms", 0.015, "<="),
        (f"{top} sessions aggregate >= 0.9 x static batch", many["aggregate_tps"],
         ceil[top]["aggregate_tps"], "", paired(many, ceil[top], "aggregate_tps"), "x", 0.9, ">="),
        (f"{top} sessions aggregate > transformers serve --c-b", many["aggregate_tps"],
         peer_cb["aggregate_tps"] if peer_cb else None, "",
         paired(many, peer_cb, "aggregate_tps") if peer_cb else None, "x", 1.0, ">"),
        (f"{top} sessions TTFT p95 <= 1.2 x static batch's", many["ttft_p95_s"],
         ceil[top]["ttft_p95_s"], "ms", ttft_p95_ratio(many, ceil[top]), "x", 1.2, "<="),
        (f"turn {len(turns)} TTFT <= 1.3 x turn 1 (median of {len(ratios)} runs)",
         turns[-1]["ttft"], turns[0]["ttft"], "ms", statistics.median(ratios), "x", 1.3, "<="),
        ("cancel to done p95 <= one decode step + 30 ms", cancel["p95_s"],
         cancel["decode_step_s"], "ms", cancel["p95_s"] - cancel["decode_step_s"], "ms", 0.030,
         "<="),
        (f"{memory['sessions']} idle sessions <= 50 MB more RSS", memory["rss_idle_mb"],
         memory["rss_none_mb"], "MB", memory["delta_mb"], "MB", 50.0, "<="),
    ]  # fmt: skip
    out = []
    for name, value, against, unit, ratio, ratio_unit, limit, op in rows:
        met = None
        if ratio is not None:
            met = {">=": ratio >= limit, "<=": ratio <= limit, ">": ratio > limit}[op]
        out.append(
            {"target": name, "value": value, "against": against, "unit": unit, "ratio": ratio,
             "ratio_unit": ratio_unit, "limit": limit, "op": op, "met": met}
        )  # fmt: skip
    if "arrivals" in result:
        out += arrivals.targets(result["arrivals"])
    if "threads" in result:
        out += threads.targets(result["threads"])
    if "widths" in result:
        out += widths.targets(result["widths"])
    if "images" in result:
        out += images.targets(result["images"])
    if "layouts" in result.get("llamacpp", {}):
        out += llamacpp.targets(result["llamacpp"])
    return out


def table(result: dict[str, Any]) -> str:
    lines = []
    ours_name = f"wschat-{result['engine']}"
    systems = [ours_name, *(k for k in result if k.startswith("wschat-") and k != ours_name)]
    systems += ["ceiling", "transformers-cb-inprocess"]
    peers = result.get("peers", {})
    systems += [k for k in peers if isinstance(peers[k], dict) and "error" not in peers[k]]
    head = f"{'system':<30}{'streams':>8}{'agg tok/s':>11}{'stream tok/s':>13}"
    head += f"{'TTFT med':>10}{'TTFT p95':>10}{'ITL p95':>9}{'vs ceiling':>11}"
    lines += [head, "-" * len(head)]
    for name in systems:
        figures = result.get(name) or peers.get(name) or {}
        if "error" in figures:
            lines.append(f"{name:<30} failed: {figures['error']}")
            continue
        for n, f in sorted(figures.items()):
            ceil = _get(result, "ceiling", n)
            ratio = paired(f, ceil, "aggregate_tps") if ceil else None
            lines.append(
                f"{name:<30}{n:>8}{f['aggregate_tps']:>11.1f}{f['stream_tps']:>13.1f}"
                f"{figure(f['ttft_median_s'], 'ms'):>10}{figure(f['ttft_p95_s'], 'ms'):>10}"
                f"{figure(f['itl_p95_s'], 'ms'):>9}{figure(ratio, 'x'):>11}"
            )
    for name, value in peers.items():
        if isinstance(value, str):
            lines.append(f"peers: {name}: {value}")
        elif isinstance(value, dict) and "error" in value:
            lines.append(f"{name:<30} failed: {value['error']}")
    lines += peer_lines(result)
    lines.append("")
    turns = result["conversation"]
    lines.append(
        "conversation TTFT by turn (ms): "
        + " ".join(f"{t['ttft'] * 1000:.0f}" for t in turns)
        + "; cached tokens at turn "
        + f"{len(turns)}: {turns[-1]['cached_tokens']} of {turns[-1]['prompt_tokens']}"
    )
    lines.append(
        f"turn {len(turns)} / turn 1 in each run: "
        + " ".join(figure(r, "x") for r in turn_ratios(result))
    )
    if "arrivals" in result:
        lines.append(arrivals.table(result["arrivals"], figure))
    c = result["cancel"]
    lines.append(
        f"cancel to done ({c['count']}x): median {figure(c['median_s'], 'ms')}, "
        f"p95 {figure(c['p95_s'], 'ms')}; one decode step {figure(c['decode_step_s'], 'ms')}"
    )
    m = result["memory"]
    lines.append(
        f"RSS: {m['rss_none_mb']:.0f} MB with no session, {m['rss_idle_mb']:.0f} MB with "
        f"{m['sessions']} idle sessions (+{m['delta_mb']:.1f} MB)"
    )
    if "threads" in result:
        lines += ["", threads.table(result["threads"], figure)]
    if "widths" in result:
        lines += ["", widths.table(result["widths"], figure)]
    if "images" in result:
        lines += ["", images.table(result["images"], figure)]
    if "layouts" in result.get("llamacpp", {}):
        lines += ["", llamacpp.table(result["llamacpp"], figure)]
    elif "llamacpp" in result:
        lines += ["", f"no llama.cpp scenario: {result['llamacpp']['skipped']}"]
    lines += ["", *target_lines(targets(result))]
    return "\n".join(lines)


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


def threads_table(result: dict[str, Any]) -> str:
    """``--only threads``: the busy-neighbour table and its targets."""
    rows = threads.targets(result["threads"])
    return "\n".join([threads.table(result["threads"], figure), "", *target_lines(rows)])


def widths_table(result: dict[str, Any]) -> str:
    """``--only widths``: the batch-width table and its targets."""
    rows = widths.targets(result["widths"])
    return "\n".join([widths.table(result["widths"], figure), "", *target_lines(rows)])


def images_table(result: dict[str, Any]) -> str:
    """``--only images``: image conversations against text ones, and the targets."""
    rows = images.targets(result["images"])
    return "\n".join([images.table(result["images"], figure), "", *target_lines(rows)])


def llamacpp_table(result: dict[str, Any]) -> str:
    """``--only llamacpp``: the llama.cpp table and its targets."""
    rows = llamacpp.targets(result["llamacpp"])
    return "\n".join([llamacpp.table(result["llamacpp"], figure), "", *target_lines(rows)])


def resume_table(result: dict[str, Any]) -> str:
    """``--only resume``: the mid-reply resume figures and their target."""
    rows = resume.targets(result["resume"])
    return "\n".join([resume.table(result["resume"], figure), "", *target_lines(rows)])


def target_lines(rows: list[dict[str, Any]]) -> list[str]:
    head = f"{'target':<62}{'measured':>12}{'against':>12}{'ratio/diff':>12}  met"
    lines = [head, "-" * len(head)]
    for t in rows:
        unit = t["unit"]
        met = {True: "yes", False: "NO", None: "-"}[t["met"]]
        lines.append(
            f"{t['target']:<62}{figure(t['value'], unit):>12}{figure(t['against'], unit):>12}"
            f"{figure(t['ratio'], t['ratio_unit']):>12}  {met}"
        )
    return lines
