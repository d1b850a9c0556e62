"""The output head of the embedded Gemma 3 270M (262,144 x 640, tied to the embedding) through
each CPU kernel, per host class (bench/hostclass.py), one thread: the gate of an int8 head.

``python -m bench.head`` takes the final hidden states of a real passage (float32 model), then,
in one process per host class, times each kernel on ``--rows`` of them in interleaved rounds
and measures its outputs on all of them against float32's. The gate: the compiled int8 head at
one row at least ``GATE`` x faster than the fp16 (fbgemm) head. Writes bench/results/head.json
(``--json``).

Kernels (where the class runs them):

- ``fp16 fbgemm``: the fp16-weights head (float16 weights packed for fbgemm, float32 in/out);
- ``bf16 onednn``: the bf16-packed head (bfloat16 weights reordered for oneDNN);
- ``bf16 linear``: plain ``F.linear`` in bfloat16;
- ``int8 eager``: ``aten._weight_int8pack_mm`` (int8 weights, one scale per row, bf16 in/out);
- ``int8 compiled``: the same op through Inductor (max-autotune, CPP GEMM, frozen weights,
  static shape), as ``int8head.Int8Head`` runs it, float32 in/out;
- ``int8 dynamic``: fbgemm's int8 x int8 (activations quantized per tensor on the fly), for
  reference: its error is far past the others'.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from . import hostclass
from .figures import Column, Section, Table, Target, at_least

log = logging.getLogger("bench.head")

ROOT = Path(__file__).resolve().parent.parent
GATE = 1.5  # the compiled int8 head over the fp16 one at one row (issue 34)
BASELINE = "fp16 fbgemm"
GATED = "int8 compiled"
POSITIONS = 64  # hidden states the errors are measured on


def _hidden_states(path: Path) -> None:
    """The float32 model's final hidden states over the README's first POSITIONS tokens."""
    import torch
    from wschat.server.engine.local.loader import load_model

    loaded = load_model("embedded", dtype="float32")
    text = (ROOT / "README.md").read_text()
    ids = loaded.tokenizer(text, return_tensors="pt").input_ids[:, :POSITIONS]
    with torch.inference_mode():
        hidden = loaded.model.model(input_ids=ids).last_hidden_state[0]
    torch.save(hidden.contiguous(), path)


def _head_weight() -> Any:
    from safetensors import safe_open
    from wschat.server.engine.local.embedded_model import embedded_model_dir

    with safe_open(str(embedded_model_dir() / "model.safetensors"), "pt") as tensors:
        return tensors.get_tensor("model.embed_tokens.weight").float()


def _kernels(weight: Any, compile_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """{name: function of float32 rows -> float32 logits} this class runs; compile facts."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from wschat.server.engine.local.int8head import Int8Head
    from wschat.server.engine.local.packed import Fp16Linear, OnednnBf16Linear

    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight.data = weight
    out: dict[str, Any] = {BASELINE: Fp16Linear(linear)}
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        onednn = OnednnBf16Linear(linear)
        out["bf16 onednn"] = lambda x: onednn(x.bfloat16()).float()
    bf16 = weight.bfloat16()
    out["bf16 linear"] = lambda x: F.linear(x.bfloat16(), bf16).float()
    head, eager = Int8Head(linear, torch.float32), Int8Head(linear, torch.float32)
    out["int8 eager"] = eager
    started = time.perf_counter()
    head.compile(1, compile_dir)
    facts = {"compile_s": time.perf_counter() - started, "compiled": head.one}
    if head.one:
        out[GATED] = head
    dynamic = torch.ao.nn.quantized.dynamic.Linear(  # type: ignore[no-untyped-call]
        weight.shape[1], weight.shape[0], bias_=False
    )
    scales = weight.abs().amax(1).clamp(min=1e-12) / 127
    zeros = torch.zeros(weight.shape[0], dtype=torch.long)
    dynamic.set_weight_bias(torch.quantize_per_channel(weight, scales, zeros, 0, torch.qint8), None)
    out["int8 dynamic"] = dynamic
    return out, facts


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One host class's figures (this process runs under its caps)."""
    import torch

    torch.set_num_threads(1)
    hidden = torch.load(args.hidden)
    weight = _head_weight()
    with torch.no_grad():  # as the loader packs; the kernels then run as the engines do
        kernels, facts = _kernels(weight, Path(args.compile_dir))
    with torch.inference_mode():
        exact = hidden.double() @ weight.double().T
        del weight
        rows = hidden[: args.rows].contiguous()
        times = hostclass.interleaved(
            {name: (lambda k=k: k(rows)) for name, k in kernels.items()}, args.rounds, args.calls
        )
        quality = {name: _quality(k(hidden).double(), exact) for name, k in kernels.items()}
    return {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "onednn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "rows": args.rows,
        **facts,
        "ms_rounds": {n: [t * 1000 for t in ts] for n, ts in times.items()},
        "ms_median": {n: statistics.median(ts) * 1000 for n, ts in times.items()},
        "speedup_vs_fp16": {
            n: hostclass.paired_speedup(times[BASELINE], ts) for n, ts in times.items()
        },
        "quality": quality,
    }  # fmt: skip


def _quality(got: Any, exact: Any) -> dict[str, float]:
    """Relative L2 error against the float64 product, and the share of positions whose argmax
    is the exact one's."""
    error = float((got - exact).norm() / exact.norm())
    agree = float((got.argmax(-1) == exact.argmax(-1)).double().mean())
    return {"rel_error": error, "argmax_agree": agree}


def targets(result: dict[str, Any]) -> list[Target]:
    """Per class, the gate: the compiled int8 head at one row at least GATE x the fp16 head."""
    rows = []
    for name, c in result["classes"].items():
        speedup = c["speedup_vs_fp16"].get(GATED)
        rows.append(
            Target.judged(
                f"{name}: {GATED} >= {GATE}x {BASELINE} at {result['rows']} row(s)",
                value=c["ms_median"].get(GATED),
                against=c["ms_median"][BASELINE],
                ratio=speedup,
                limit=at_least(GATE),
                unit=".2f",
            )
        )
    return rows


TABLE = (
    Column("class", 13, left=True),
    Column("kernel", 15, left=True),
    Column("ms", 9, ".2f"),
    Column("vs fp16", 9, "x"),
    Column("rel err", 10, left=False),
    Column("argmax", 8, ".2f"),
)


def report(result: dict[str, Any]) -> Section:
    table = Table(TABLE)
    for name, c in result["classes"].items():
        for kernel, ms in c["ms_median"].items():
            q = c["quality"][kernel]
            speedup = c["speedup_vs_fp16"][kernel]
            table.add(name, kernel, ms, speedup, f"{q['rel_error']:.2e}", q["argmax_agree"])
    head = (
        f"head {result['shape']}, {result['rows']} row(s), 1 thread, median ms over "
        f"{result['rounds']} interleaved rounds; vs fp16 = fp16 fbgemm's time over the "
        "kernel's (median of per-round ratios); argmax: share of positions agreeing with float64"
    )
    return Section([head, table], targets(result))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.head", description=__doc__)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=10, help="calls per kernel per round")
    parser.add_argument("--classes", nargs="+", choices=list(hostclass.CLASSES))
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "head.json")
    kernels = Path(tempfile.gettempdir()) / "wschat-bench-head"
    parser.add_argument("--compile-dir", default=str(kernels), help="the kernels' cache")
    parser.add_argument("--hidden", help=argparse.SUPPRESS)
    args = hostclass.parse(parser, argv, child)
    if args is None:
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    classes = args.classes or hostclass.available()
    result: dict[str, Any] = {
        "rows": args.rows, "rounds": args.rounds, "calls": args.calls, "shape": "262144 x 640",
        "load_average_at_start": os.getloadavg(), "classes": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        hidden = Path(scratch) / "hidden.pt"
        _hidden_states(hidden)
        for name in classes:
            caps = " ".join(f"{k}={v}" for k, v in hostclass.CLASSES[name].items())
            log.info("%s: %s", name, caps or "as it is")
            child_args = ["--child", "--hidden", str(hidden), "--rows", str(args.rows)]
            child_args += ["--rounds", str(args.rounds), "--calls", str(args.calls)]
            child_args += ["--compile-dir", str(Path(args.compile_dir) / name)]
            figures = hostclass.run_child(name, "bench.head", child_args, timeout=3600)
            result["classes"][name] = figures
    hostclass.save(result, args.json, report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
