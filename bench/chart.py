"""docs/bench.png: aggregate tokens/s and TTFT p95 against concurrency, for every system run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

STYLES = {
    "ceiling": ("in-process static batch (ceiling)", "k", "--"),
    "wschat-batched": ("wschat --engine batched", "tab:blue", "-"),
    "wschat-generate": ("wschat --engine generate", "tab:cyan", "-"),
    "transformers-cb-inprocess": ("transformers CB manager (in process)", "tab:gray", ":"),
    "transformers-serve": ("transformers serve", "tab:orange", "-"),
    "transformers-serve-cb": ("transformers serve --continuous-batching", "tab:red", "-"),
    "llama.cpp-server": ("llama.cpp's server (same GGUF, Q4_K_M kernels)", "tab:green", "-"),
}


def series(result: dict[str, Any]) -> dict[str, dict[int, dict[str, float]]]:
    found = {**result, **result.get("peers", {})}
    out = {}
    for name in STYLES:
        figures = found.get(name)
        if isinstance(figures, dict) and figures and "error" not in figures:
            out[name] = {int(n): f for n, f in figures.items() if isinstance(f, dict)}
    return out


def draw(result: dict[str, Any], path: Path) -> str | None:
    """Draw the chart; the reason when it cannot be drawn (no matplotlib), else None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e .[bench])"
    fig, (agg, ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, figures in series(result).items():
        label, color, line = STYLES[name]
        ns = sorted(figures)
        style = {"color": color, "linestyle": line, "marker": "o", "label": label}
        agg.plot(ns, [figures[n]["aggregate_tps"] for n in ns], **style)
        ttft.plot(ns, [figures[n]["ttft_p95_s"] * 1000 for n in ns], **style)
    agg.set(xlabel="concurrent sessions", ylabel="aggregate tokens/s", title="Throughput")
    ttft.set(xlabel="concurrent sessions", ylabel="TTFT p95 (ms)", title="Time to first token")
    ttft.set_yscale("log")
    for ax in (agg, ttft):
        ax.grid(alpha=0.3)
        ax.set_xticks(sorted({n for f in series(result).values() for n in f}))
    agg.legend(fontsize=8)
    fig.suptitle(f"Gemma 3 270M, {result.get('machine', {}).get('summary', '')}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
