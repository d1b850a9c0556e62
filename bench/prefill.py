"""One Gemma 3 270M decoder layer's Linear layers (as ``fused.py`` packs them: qkv 1536 x 640,
o 640 x 1024, gate/up 4096 x 640, down 640 x 2048) at decode and prefill row counts, through
each CPU kernel, per host class (bench/hostclass.py), one thread.

``python -m bench.prefill`` times, in one process per class and in interleaved rounds, each
kernel on each row count (``--rows``, default 1, 14, 112, 512: a decode step, a short prompt,
8 of them at once, a long chunk). A layer's time is the sum of its four Linears' medians; the
ratio is fp16 fbgemm's over the kernel's, the median of per-round ratios. Kernels:

- ``fp16 fbgemm``: the fp16-weights layout (float16 packed for fbgemm, float32 in/out);
- ``fp32 from fp16``: the same packed weight unpacked to float32 in the call, then ``F.linear``
  in float32 (one stored copy: the conversion is paid per call);
- ``bf16 from fp16``: unpacked, cast to bfloat16 in the call, ``F.linear`` in bfloat16 (oneDNN;
  where the class has bf16 instructions), float32 in/out;
- ``bf16 onednn``: the bf16-packed layout (bfloat16 weights reordered once for oneDNN; a
  second stored copy if used beside fp16's), bfloat16 in/out;
- ``fp32``: plain float32 weights (a second copy, twice fp16's bytes): the reference.

Writes bench/results/prefill.json (``--json``).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
from pathlib import Path
from typing import Any

from . import hostclass
from .figures import Cell, Column, Section, Table

log = logging.getLogger("bench.prefill")

ROOT = Path(__file__).resolve().parent.parent
SHAPES = {"qkv": (1536, 640), "o": (640, 1024), "gate_up": (4096, 640), "down": (640, 2048)}
BASELINE = "fp16 fbgemm"


def _kernels(out_features: int, in_features: int) -> dict[str, Any]:
    """{name: function of float32 rows -> float32 outputs} for a random weight of that shape."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from wschat.server.engine.local.packed import Fp16Linear, OnednnBf16Linear

    linear = nn.Linear(in_features, out_features, bias=False)
    fp16 = Fp16Linear(linear)
    packed = fp16.packed

    def fp32_from_fp16(x: torch.Tensor) -> torch.Tensor:
        weight = torch.ops.quantized.linear_unpack_fp16(packed)[0]
        return F.linear(x, weight)

    def bf16_from_fp16(x: torch.Tensor) -> torch.Tensor:
        weight = torch.ops.quantized.linear_unpack_fp16(packed)[0].bfloat16()
        return F.linear(x.bfloat16(), weight).float()

    fp32 = linear.weight.detach().clone()
    out: dict[str, Any] = {BASELINE: fp16, "fp32 from fp16": fp32_from_fp16}
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        onednn = OnednnBf16Linear(linear)
        out["bf16 from fp16"] = bf16_from_fp16
        out["bf16 onednn"] = lambda x: onednn(x.bfloat16()).float()
    out["fp32"] = lambda x: F.linear(x, fp32)
    return out


def child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    ms: dict[str, dict[str, dict[str, list[float]]]] = {}  # rows: shape: kernel: per round
    with torch.inference_mode():
        kernels = {shape: _kernels(*dims) for shape, dims in SHAPES.items()}
        for rows in args.rows:
            ms[str(rows)] = {}
            for shape, by_name in kernels.items():
                x = torch.randn(rows, SHAPES[shape][1])
                calls = {name: (lambda k=k, x=x: k(x)) for name, k in by_name.items()}
                times = hostclass.interleaved(calls, args.rounds, args.calls, warmup=2)
                ms[str(rows)][shape] = {n: [t * 1000 for t in ts] for n, ts in times.items()}
    return {"capability": torch.backends.cpu.get_cpu_capability(), "ms_rounds": ms}


def layer_figures(ms_rounds: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Per kernel: a layer's time (the sum of its shapes' medians) and its speedup over fp16
    fbgemm (the median over rounds of the per-round layer sums' ratio)."""
    shapes = list(ms_rounds)
    names = list(ms_rounds[shapes[0]])
    rounds = len(ms_rounds[shapes[0]][names[0]])
    per_round = {n: [sum(ms_rounds[s][n][r] for s in shapes) for r in range(rounds)] for n in names}
    return {
        n: {
            "ms": sum(statistics.median(ms_rounds[s][n]) for s in shapes),
            "speedup_vs_fp16": hostclass.paired_speedup(per_round[BASELINE], per_round[n]),
        }
        for n in names
    }


def report(result: dict[str, Any]) -> Section:
    """A table per class and row count: each kernel's layer time and speedup over fp16."""
    kernels = result["kernels"]
    columns = [Column("class", 13, left=True), Column("rows", 6, "n")]
    for name in kernels:
        columns += [Column(f"{name} ms", max(len(name) + 5, 10), ".2f"), Column("x", 8, "x")]
    table = Table(tuple(columns))
    for name, c in result["classes"].items():
        for rows, figures in c["layer"].items():
            cells: list[Cell] = [name, float(rows)]
            for kernel in kernels:
                f = figures.get(kernel, {})
                cells += [f.get("ms"), f.get("speedup_vs_fp16")]
            table.add(*cells)
    head = (
        "a decoder layer's Linears, 1 thread, ms (sum of the shapes' medians over "
        f"{result['rounds']} interleaved rounds) and speedup over fp16 fbgemm"
    )
    return Section([head, table])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prefill", description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 14, 112, 512])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=5, help="calls per kernel per round")
    parser.add_argument("--classes", nargs="+", choices=list(hostclass.CLASSES))
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "prefill.json")
    args = hostclass.parse(parser, argv, child)
    if args is None:
        return 0
    classes = args.classes or hostclass.available()
    result: dict[str, Any] = {
        "rows": args.rows, "rounds": args.rounds, "calls": args.calls, "shapes": SHAPES,
        "load_average_at_start": os.getloadavg(), "classes": {},
        "kernels": [BASELINE, "fp32 from fp16", "bf16 from fp16", "bf16 onednn", "fp32"],
    }  # fmt: skip
    for name in classes:
        log.info("%s: %s", name, " ".join(f"{k}={v}" for k, v in hostclass.CLASSES[name].items()))
        child_args = ["--child", "--rounds", str(args.rounds), "--calls", str(args.calls)]
        child_args += ["--rows", *map(str, args.rows)]
        figures = hostclass.run_child(name, "bench.prefill", child_args, timeout=3600)
        figures["layer"] = {rows: layer_figures(ms) for rows, ms in figures["ms_rounds"].items()}
        result["classes"][name] = figures
    hostclass.save(result, args.json, report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
