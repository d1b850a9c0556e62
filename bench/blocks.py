"""The decoder blocks' Linear layers of Gemma 3 270M (as ``fused.py`` packs them: qkv 1536 x 640,
o 640 x 1024, gate/up 4096 x 640, down 640 x 2048; 18 layers) through each CPU kernel, per host
class (bench/hostclass.py), one thread, one row: the gate of int8 block weights (issue 34).

``python -m bench.blocks`` times, in one process per class and in interleaved rounds, each kernel
on each shape (one weight, called again and again) and on a whole decode step's block Linears
(72 weights of their own, each read once per step, as a step reads them), and measures each
kernel's output against the float64 product. The gate: an int8 kernel's whole step at least
``GATE`` x faster than the kernel the class's ``auto`` uses today (AMX: bf16 onednn;
AVX512-BF16 and AVX2: fp16 fbgemm). Writes bench/results/blocks.json (``--json``).

Kernels (where the class runs them), fed the activations' dtype of the class's ``auto``
(bfloat16 with AMX, float32 elsewhere; a kernel's casts are part of its time):

- ``fp16 fbgemm``: the fp16-weights layout (float16 packed for fbgemm, float32 in/out);
- ``bf16 onednn``: the bf16-packed layout (bfloat16 reordered once for oneDNN, bf16 in/out);
- ``int8 eager``: ``aten._weight_int8pack_mm`` (int8 weights, one scale per row), fed
  bfloat16 as the int8 head is (``--int8-rows native``: the class's dtype; in float32 the
  kernel is 10-100x slower, ``bench/results/blocks-native.json``);
- ``int8 compiled``: the same op through Inductor as ``int8head.py`` compiles the head
  (max-autotune, CPP GEMM template, frozen weights, a static shape): a graph per shape for the
  shapes' figures, and one graph holding all 72 products for the step's (no call between them:
  the most a compiled path could give, an engine calls them with attention between);
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
import types
from pathlib import Path
from typing import Any

from . import hostclass
from .figures import Column, Section, Table, Target, at_least
from .prefill import SHAPES

log = logging.getLogger("bench.blocks")

ROOT = Path(__file__).resolve().parent.parent
GATE = 1.3  # an int8 kernel's whole step over today's kernel's, to be worth building
LAYERS = 18  # Gemma 3 270M's decoder layers
STEP = "step"  # the whole step's row in the figures, beside the shapes'
INT8 = ("int8 eager", "int8 compiled")
TODAY = {hostclass.AMX: "bf16 onednn"}  # the kernel auto uses; fp16 fbgemm elsewhere


def today(host_class: str) -> str:
    return TODAY.get(host_class, "fp16 fbgemm")


def _int8(weight: Any, dtype: Any) -> tuple[Any, Any]:
    """``weight`` as int8 with one scale per row (its largest magnitude over 127, in ``dtype``:
    the kernel takes its rows, scales and outputs in one dtype)."""
    import torch

    scales = (weight.abs().amax(1) / 127).clamp(min=1e-12).to(dtype)
    q = (weight / scales.float()[:, None]).round().clamp(-127, 127).to(torch.int8)
    return q, scales


class _Kernels:
    """Every kernel's function of one weight (rows in the class's dtype -> outputs in it)."""

    def __init__(self, weight: Any, dtype: Any, int8_rows: Any) -> None:
        import torch
        from torch import nn
        from wschat.server.engine.local.packed import Fp16Linear, OnednnBf16Linear

        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        linear.weight.data = weight
        self.dtype = dtype
        self.calls: dict[str, Any] = {}
        fp16 = Fp16Linear(linear)
        self.calls["fp16 fbgemm"] = self._cast(fp16, torch.float32)
        if torch.ops.mkldnn._is_mkldnn_bf16_supported():
            self.calls["bf16 onednn"] = self._cast(OnednnBf16Linear(linear), torch.bfloat16)
        self.q, self.scales = _int8(weight, int8_rows)
        eager = torch.ops.aten._weight_int8pack_mm
        self.calls["int8 eager"] = self._cast(lambda x: eager(x, self.q, self.scales), int8_rows)
        dynamic = torch.ao.nn.quantized.dynamic.Linear(  # type: ignore[no-untyped-call]
            weight.shape[1], weight.shape[0], bias_=False
        )
        zeros = torch.zeros(weight.shape[0], dtype=torch.long)
        q = torch.quantize_per_channel(weight, self.scales.float(), zeros, 0, torch.qint8)
        dynamic.set_weight_bias(q, None)
        self.calls["int8 dynamic"] = self._cast(dynamic, torch.float32)

    def _cast(self, kernel: Any, takes: Any) -> Any:
        """``kernel`` (of ``takes`` rows) fed and giving the class's dtype."""
        if takes == self.dtype:
            return kernel
        dtype = self.dtype
        return lambda x: kernel(x.to(takes)).to(dtype)


def _compiled(weights: list[tuple[Any, Any]], dtype: Any, int8_rows: Any, host: str) -> Any:
    """One Inductor graph (as ``int8head`` compiles the head) of the products of ``weights``
    (int8, scales) by rows of their width, in order: a function of {width: rows} -> outputs."""
    import torch
    from torch import nn
    from wschat.server.engine.local import int8head

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for i, (q, scales) in enumerate(weights):
                self.register_buffer(f"q{i}", q, persistent=False)
                self.register_buffer(f"s{i}", scales, persistent=False)

        def forward(self, rows: dict[int, torch.Tensor]) -> list[torch.Tensor]:
            mm = torch.ops.aten._weight_int8pack_mm
            out = []
            for i in range(len(weights)):
                q, scales = getattr(self, f"q{i}"), getattr(self, f"s{i}")
                out.append(mm(rows[q.shape[1]].to(int8_rows), q, scales).to(dtype))
            return out

    # a code object of its own per graph: the compiler keeps its graphs per code object and
    # tells modules apart by their buffers' shapes, never their (frozen) values
    own = Stack.forward
    forward = types.FunctionType(
        own.__code__.replace(), own.__globals__, None, None, own.__closure__
    )
    stack = Stack()
    with tempfile.TemporaryDirectory() as cache, int8head.compiling(host, Path(cache)):
        compiled = torch.compile(types.MethodType(forward, stack), fullgraph=True)
        widths = {int(q.shape[1]) for q, _ in weights}
        with torch.inference_mode():
            compiled({w: torch.zeros(1, w, dtype=dtype) for w in widths})
    return compiled


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One host class's figures (this process runs under its caps)."""
    import torch
    from wschat.server.engine.local.precision import host_class

    torch.set_num_threads(1)
    torch.manual_seed(0)
    host = host_class()
    dtype = torch.bfloat16 if host == hostclass.AMX else torch.float32
    int8_rows = dtype if args.int8_rows == "native" else torch.bfloat16
    compile_s: dict[str, float] = {}
    with torch.no_grad():
        layers = [  # weights about as wide as the model's (their values do not change a time)
            {s: torch.randn(*dims) * 0.03 for s, dims in SHAPES.items()} for _ in range(LAYERS)
        ]
        kernels = [{s: _Kernels(w, dtype, int8_rows) for s, w in layer.items()} for layer in layers]
        graphs = {}
        for shape in SHAPES:
            k = kernels[0][shape]
            started = time.perf_counter()
            graphs[shape] = _compiled([(k.q, k.scales)], dtype, int8_rows, host)
            compile_s[shape] = time.perf_counter() - started
        started = time.perf_counter()
        step_graph = _compiled(
            [(k.q, k.scales) for layer in kernels for k in layer.values()], dtype, int8_rows, host
        )
        compile_s[STEP] = time.perf_counter() - started
    times: dict[str, dict[str, list[float]]] = {}
    quality: dict[str, dict[str, float]] = {}
    with torch.inference_mode():
        rows = {w: torch.randn(args.rows, w).to(dtype) for w in {d[1] for d in SHAPES.values()}}
        for shape, (_, width) in SHAPES.items():
            x, k = rows[width], kernels[0][shape]
            calls: dict[str, Any] = {n: (lambda f=f, x=x: f(x)) for n, f in k.calls.items()}
            calls["int8 compiled"] = lambda g=graphs[shape]: g(rows)
            times[shape] = hostclass.interleaved(calls, args.rounds, args.calls)
            exact = x.double() @ layers[0][shape].double().T
            quality[shape] = {n: _error(f(x).double(), exact) for n, f in k.calls.items()}
            quality[shape]["int8 compiled"] = _error(graphs[shape](rows)[0].double(), exact)
        names = list(kernels[0]["qkv"].calls)
        steps = {n: _step(kernels, n, rows) for n in names}
        steps["int8 compiled"] = lambda: step_graph(rows)
        times[STEP] = hostclass.interleaved(steps, args.rounds, max(1, args.calls // 4))
    base, ms = today(host), times.items()
    return {
        "host_class": host,
        "capability": torch.backends.cpu.get_cpu_capability(),
        "activations": str(dtype).removeprefix("torch."),
        "int8_rows": str(int8_rows).removeprefix("torch."),
        "today": base,
        "compile_s": compile_s,
        "ms_rounds": {s: {n: [t * 1e3 for t in ts] for n, ts in by.items()} for s, by in ms},
        "ms_median": {s: {n: statistics.median(ts) * 1e3 for n, ts in by.items()} for s, by in ms},
        "speedup_vs_today": {
            s: {n: hostclass.paired_speedup(by[base], ts) for n, ts in by.items()}
            for s, by in times.items()
        },
        "rel_error": quality,
    }  # fmt: skip


def _step(kernels: list[dict[str, _Kernels]], name: str, rows: dict[int, Any]) -> Any:
    """A decode step's block Linears through kernel ``name``: every layer's, in order."""
    calls = [(k.calls[name], rows[SHAPES[s][1]]) for layer in kernels for s, k in layer.items()]

    def step() -> None:
        for call, x in calls:
            call(x)

    return step


def _error(got: Any, exact: Any) -> float:
    """Relative L2 error against the float64 product."""
    return float((got - exact).norm() / exact.norm())


def targets(result: dict[str, Any]) -> list[Target]:
    """Per class and int8 kernel, the gate: its whole step at least GATE x today's kernel's."""
    rows = []
    for name, c in result["classes"].items():
        base = c["today"]
        for kernel in INT8:
            rows.append(
                Target.judged(
                    f"{name}: {kernel} step >= {GATE}x {base} at {result['rows']} row(s)",
                    value=c["ms_median"][STEP].get(kernel),
                    against=c["ms_median"][STEP][base],
                    ratio=c["speedup_vs_today"][STEP].get(kernel),
                    limit=at_least(GATE),
                    unit=".2f",
                )
            )
    return rows


TABLE = (
    Column("class", 13, left=True),
    Column("linear", 8, left=True),
    Column("kernel", 14, left=True),
    Column("ms", 8, ".2f"),
    Column("vs today", 9, "x"),
    Column("rel err", 10, left=False),
)


def report(result: dict[str, Any]) -> Section:
    table = Table(TABLE)
    for name, c in result["classes"].items():
        for shape, by in c["ms_median"].items():
            for kernel, ms in by.items():
                error = c["rel_error"].get(shape, {}).get(kernel)
                table.add(
                    name,
                    shape,
                    kernel,
                    ms,
                    c["speedup_vs_today"][shape][kernel],
                    "" if error is None else f"{error:.2e}",
                )
    head = (
        f"block Linears of Gemma 3 270M, {result['rows']} row(s), 1 thread, median ms over "
        f"{result['rounds']} interleaved rounds; step: the {LAYERS} layers' 72 Linears, each its "
        "own weight; vs today = the class's auto kernel's time over this one's (median of "
        "per-round ratios); rel err: L2 against float64"
    )
    return Section([head, table], targets(result))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.blocks", description=__doc__)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20, help="calls per kernel per round")
    parser.add_argument("--classes", nargs="+", choices=list(hostclass.CLASSES))
    parser.add_argument(
        "--int8-rows",
        choices=["bfloat16", "native"],
        default="bfloat16",
        help="the dtype the int8 kernels take: bfloat16, or the class's own (float32 or bf16)",
    )
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "blocks.json")
    args = hostclass.parse(parser, argv, child)
    if args is None:
        return 0
    classes = args.classes or hostclass.available()
    result: dict[str, Any] = {
        "rows": args.rows, "rounds": args.rounds, "calls": args.calls, "shapes": SHAPES,
        "layers": LAYERS, "int8_rows": args.int8_rows,
        "load_average_at_start": os.getloadavg(), "classes": {},
    }  # fmt: skip
    for name in classes:
        log.info("%s: %s", name, " ".join(f"{k}={v}" for k, v in hostclass.CLASSES[name].items()))
        child_args = ["--child", "--rows", str(args.rows), "--int8-rows", args.int8_rows]
        child_args += ["--rounds", str(args.rounds), "--calls", str(args.calls)]
        result["classes"][name] = hostclass.run_child(name, "bench.blocks", child_args, 3600)
    hostclass.save(result, args.json, report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
