"""The output head in int8, one scale per row (weight-only: bfloat16 activations), through the
GEMM kernel Inductor generates for ``aten._weight_int8pack_mm``.

Why the head: Gemma 3's tied head (262,144 x 640 for the 270M) is most of the weights and about
half of a one-row decode step, and a decode step's time is the bytes of its weights. In int8 the
head reads half the bytes of the float16 or bfloat16 head, and the compiled kernel turns that
into time: one row, one thread, 1.9-2.2x faster than fbgemm's float16 head with AVX512 (with
AMX and without) and 1.4-1.6x with AVX2 (``python -m bench.head``,
``bench/results/head.json``).

The kernel is Inductor's C++ GEMM template: it is generated only with ``max_autotune`` (the
C++ backend alone: no run-time race against the eager kernel on a busy machine) and
``freezing`` (the weight a constant, reordered once for the kernel). Two graphs: one for a
single row (a static shape: the small-M micro-kernel, a lone conversation's step; two rows call
it once each) and, with AMX only, one for any count from two on (a dynamic shape: batched
steps); elsewhere that graph is slower than the eager kernel, which runs calls of three rows or
more. Each graph holds its own reordered copy, so once both exist the plain int8 weight is
handed back: the head then costs the float16 head's bytes in all (off AMX the one-row graph
and the eager kernel's weight, the same bytes). Compiling happens when an engine is built
(``prepare``), never while a reply waits: a call no graph covers runs the eager kernel while
the plain weight is there. Each graph is compiled ahead of time
(``torch._inductor.aoti_compile_and_package``: the kernel, its wrapper and the reordered weight
in one shared library), and that library is saved as
``<cache dir>/inductor/<host class>/<the weight's digest>/torch-<version>/<rows>.so``, beside
the quantized head's scales (``scales.pt``: what the graphs' callers multiply by); a later start
loads them in a fraction of a second, with no tracing, no compiler and no quantizing: the
weight is quantized only when a graph is built, or when the eager kernel runs.
A compile that fails leaves the eager kernel, with one log line.

It is compiled with one torch thread: the template then shares its loop over the output
columns among the threads of the calling worker (``omp for``), where a kernel compiled for N
threads would start N whatever the worker's count (``threads.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import time
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..embedded import cache_lock
from .mapped_pages import drop_clean_pages, mapped_files
from .precision import AMX, host_class
from .ticker import Ticker

log = logging.getLogger("wschat.engine.int8head")

ACTIVATIONS = torch.bfloat16  # the dtype the kernel takes and gives; its scales are in it too
_QUANTIZE_ROWS = 16384  # rows quantized at once: the float32 copy of a slice, not the whole
# Inductor's settings while compiling (a patch of its config: ``torch.compile``'s options
# come too late for freezing)
_COMPILE_CONFIG = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP"}
# The many-rows graph's upper bound (Inductor needs one) is at least this, whatever the width
# asked for: the bound is part of the graph's cache key, and engines of any width up to the
# CPU's default (settings.PREFERRED) then share one compiled graph on disk
MANY_ROWS = 32
# Calls of up to this many rows run the one-row graph row by row: the many-rows graph, compiled
# for a range of rows, is slower than that at two rows on every class
ONE_ROW_CALLS = 2
# Where the many-rows graph is compiled: elsewhere (AVX512 without AMX, AVX2) it is slower
# than the eager kernel at every width, so wider calls run the eager kernel, whose int8 weight
# then stays (the graph's own copy is not made: the same bytes)
MANY_ROWS_GRAPH_CLASSES = (AMX,)
_CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
# Part of the cache's key: a change to ``quantized`` changes it, so that a cache written by
# another quantizer is never read
_QUANTIZER = b"int8 rows, sqrt columns"
_SCALES = "scales.pt"  # beside the packages: the ``columns`` and ``scales`` they were built with
_LEAF_SPEC = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
# A compiled graph: the shared library of Inductor's ahead-of-time package, loaded (``_load``)
Graph = Callable[[torch.Tensor], torch.Tensor]


def quantized(
    weight: torch.Tensor, even_columns: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``weight`` ``[out, in]`` as ``(q, scales, columns)``: ``weight[n, k]`` is about
    ``q[n, k] * scales[n] * columns[k]``, so ``F.linear(x, weight)`` is about
    ``_weight_int8pack_mm(x * columns, q, scales)``. Without ``even_columns``, ``columns`` are
    ones: the decoder blocks' weights (``packed.Int8StepLinear``) came from that GGUF's 4- to
    6-bit blocks and keep their perplexity better per row alone.

    ``columns`` (float32) evens out the columns' ranges first, the square root of each one's
    largest magnitude (over the largest's): without it the few wide columns set every row's
    scale and the narrow ones keep a handful of levels. The embedded model's head came from a
    GGUF whose int8 blocks of 32 each have their own scale; per row alone, its perplexity on
    the fixed passage rose 0.8 %, with ``columns`` it is within 0.3 % of float32's
    (``tests/engine/test_packed.py``: 24.2987 float32, 24.2255 ``fp16-int8head``, 24.2814
    ``bf16-int8head``). Then per row: the largest magnitude over 127, rounded
    to a bfloat16 (``scales``), and the row divided by that rounded scale, rounded and clamped
    to [-127, 127] (``q``)."""
    rows, width = weight.shape
    tiny = torch.finfo(torch.float32).tiny
    columns = torch.ones(width)
    if even_columns:
        widest = torch.zeros(width)
        for start in range(0, rows, _QUANTIZE_ROWS):  # a float32 copy of a slice, not the whole
            part = weight[start : start + _QUANTIZE_ROWS].float().abs()  # float() may be weight
            widest = torch.maximum(widest, part.amax(0))
        columns = (widest / widest.max().clamp(min=tiny)).sqrt_().clamp_(min=tiny)
    q = torch.empty(weight.shape, dtype=torch.int8)
    scales = torch.empty(rows, dtype=ACTIVATIONS)
    for start in range(0, rows, _QUANTIZE_ROWS):
        part = weight[start : start + _QUANTIZE_ROWS].float() / columns
        scale = (part.abs().amax(1) / 127).clamp(min=tiny).to(ACTIVATIONS)
        part = (part / scale.float()[:, None]).round_().clamp_(-127, 127)
        q[start : start + _QUANTIZE_ROWS] = part
        scales[start : start + _QUANTIZE_ROWS] = scale
    return q, scales, columns


def tensor_digest(*tensors: torch.Tensor, salt: bytes = b"") -> str:
    """A digest of the tensors' bytes (and ``salt``): the key of a compiled kernel in the
    cache. Inductor's own key knows a frozen weight by its shape, and the reordered weight it
    stores with the kernel would serve another model's head of that shape."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(salt)
    for tensor in tensors:
        digest.update(f"{tensor.dtype} {tuple(tensor.shape)};".encode())
        flat = tensor.contiguous().view(torch.uint8).reshape(-1)
        for part in torch.split(flat, 1 << 24):  # copies: numpy() would pin the tensor's storage
            digest.update(part.clone().numpy().tobytes())
    return digest.hexdigest()


class _Matmul(nn.Module):
    """The op Inductor compiles, its weight and scales as buffers (constants once frozen)."""

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor) -> None:
        super().__init__()
        self.weight: torch.Tensor
        self.scales: torch.Tensor
        self.register_buffer("weight", weight, persistent=False)
        self.register_buffer("scales", scales, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.aten._weight_int8pack_mm(x, self.weight, self.scales)
        return out


class Int8Head(nn.Module):
    """``F.linear`` of the head with its weight in int8 (``quantized``); takes and gives the
    model's compute dtype ``dtype``, multiplies in bfloat16 with float32 sums. The weight is
    quantized when first needed (``_quantize``): a start whose graphs are in the cache never
    does."""

    in_features: int
    out_features: int
    dtype: torch.dtype
    matmul: _Matmul | None  # the int8 weight and its scales, once quantized
    columns: torch.Tensor | None  # once quantized, or read from the cache
    key: str  # of the compiled kernel in the cache: the float weight's digest
    compiled_one: Graph | None  # the one-row graph
    compiled_many: Graph | None  # the graph for two rows or more
    widest: int  # the most rows the two-or-more graph takes in one call
    _failed_calls: int

    def __init__(self, linear: nn.Linear, dtype: torch.dtype) -> None:
        super().__init__()
        if linear.bias is not None:
            raise ValueError("an int8 head with a bias is not supported")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.dtype = dtype
        # the float weight until it is quantized, or until the graphs no longer need it
        self._source: torch.Tensor | None = linear.weight.detach()
        self.key = tensor_digest(self._source, salt=_QUANTIZER)
        self.matmul, self.columns = None, None
        self.compiled_one, self.compiled_many, self.widest = None, None, 0
        self._failed_calls = 0

    def _quantize(self) -> _Matmul:
        """The int8 weight, quantized now if it is not yet (the eager kernel, or a build)."""
        if self.matmul is None:
            if self._source is None:
                raise RuntimeError("the int8 head's weight was handed back")
            q, scales, self.columns = quantized(self._source)
            self.matmul, self._source = _Matmul(q, scales), None
        return self.matmul

    @property
    def one(self) -> bool:
        """Compiled: the one-row graph."""
        return self.compiled_one is not None

    @property
    def many(self) -> bool:
        """Compiled: the graph for two rows or more."""
        return self.compiled_many is not None

    @property
    def eager(self) -> bool:
        """Whether the eager kernel can run: the int8 weight is there, or the float weight to
        quantize."""
        if self.matmul is None:
            return self._source is not None
        return bool(self.matmul.weight.untyped_storage().nbytes() > 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.columns is None:
            self._quantize()
        assert self.columns is not None
        rows = (x.reshape(-1, self.in_features).float() * self.columns).to(ACTIVATIONS)
        if 1 < rows.shape[0] <= ONE_ROW_CALLS and self.compiled_one is not None:
            out = torch.cat([self._product(row) for row in torch.split(rows, 1)])
        elif rows.shape[0] > 1 and self.compiled_many is not None:
            out = torch.cat([self._product(part) for part in torch.split(rows, self.widest)])
        else:
            out = self._product(rows)
        return out.to(self.dtype).reshape(*x.shape[:-1], self.out_features)

    def _product(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` (at most ``widest`` when more than one) through the graph compiled for
        their count, or the eager kernel where none is."""
        graph = self.compiled_one if rows.shape[0] == 1 else self.compiled_many
        if graph is None:
            eager: torch.Tensor = self._quantize()(rows)
            return eager
        try:
            with torch.inference_mode():
                out: torch.Tensor = graph(rows)
                return out
        except Exception as error:  # never compile now: the eager kernel while it is there
            if not self.eager:
                raise
            self._failed_calls += 1
            if self._failed_calls == 1:
                reason = (str(error).splitlines() or [type(error).__name__])[0]
                log.warning("int8 head: a call ran the eager kernel (%s)", reason)
            fallback: torch.Tensor = self._quantize()(rows)
            return fallback

    def extra_repr(self) -> str:
        compiled = (("1 row", self.one), (f"2-{self.widest} rows", self.many))
        graphs = [name for name, done in compiled if done]
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, int8, "
            f"compiled for {', '.join(graphs) or 'none'}"
        )

    def compile(self, rows: int, cache_dir: Path) -> None:
        """Load, or compile and save, the graphs calls of up to ``rows`` rows need
        (``prepare``) and do not have yet; hand the plain weight back once both are there."""
        host = host_class()
        many = max(rows, MANY_ROWS)
        many_graph = rows > ONE_ROW_CALLS and host in MANY_ROWS_GRAPH_CLASSES
        wanted = ([] if self.one else [1]) + ([many] if many_graph and not self.many else [])
        if rows > ONE_ROW_CALLS and not many_graph and self.eager:
            self._quantize()  # the eager kernel's weight, now: never while a reply waits
        if not wanted or not self.eager:
            return
        folder = cache_dir / "inductor" / host / self.key
        packages = folder / f"torch-{torch.__version__}"  # a package runs on its own torch only
        started = time.perf_counter()
        what = " and ".join("1 row" if n == 1 else f"2 to {n} rows" for n in wanted)
        hits = 0
        try:
            for n in wanted:
                package = packages / ("1.so" if n == 1 else f"2-{n}.so")
                # a package is renamed into place whole: loaded without the lock
                graph = self._loaded(package)
                if graph is None:
                    # one process compiles, the others wait and load its package
                    with cache_lock(folder.with_name(folder.name + ".lock")):
                        graph = self._loaded(package)  # another process's, written meanwhile
                        if graph is None:
                            graph = self._build(n, package, what, host)
                else:
                    hits += 1
                if n == 1:
                    self.compiled_one = graph
                else:
                    self.compiled_many, self.widest = graph, n
        except Exception as error:
            log.warning(
                "int8 head: compiling failed, its eager kernel runs instead (slower): %s",
                (str(error).splitlines() or [type(error).__name__])[0],
            )
            return
        log.info(
            "int8 head: compiled for %s in %.1f s (%d of %d from the cache)",
            what,
            time.perf_counter() - started,
            hits,
            len(wanted),
        )
        if self.one and self.many:
            # every call is the graphs' now, each with its own reordered copy of the weight
            if self.matmul is not None:
                self.matmul.weight.untyped_storage().resize_(0)
            self._source = None

    def _build(self, rows: int, package: Path, what: str, host: str) -> Graph:
        """Compile the graph for one row (``rows`` 1: a static shape) or for two to ``rows`` (a
        dynamic one: the package needs its bound) into ``package``, whole or not at all; the
        graph loaded from it."""
        import torch._inductor  # here: the compiler's modules take seconds to import

        log.info(
            "int8 head: compiling its kernel for %s (the first start takes minutes; later "
            "ones read %s)",
            what,
            package.parent,
        )
        matmul = self._quantize()
        assert self.columns is not None
        package.parent.mkdir(parents=True, exist_ok=True)
        scales = package.parent / _SCALES
        if not scales.exists():  # the same key quantizes the same: the first graph's serve all
            _save_scales(scales, self.columns, matmul.scales)
        x = torch.zeros(1 if rows == 1 else min(rows, 4), self.in_features, dtype=ACTIVATIONS)
        shapes = None if rows == 1 else {"x": {0: torch.export.Dim("rows", min=2, max=rows)}}
        with (
            Ticker(log, f"compiling the int8 head for {what}"),
            tempfile.TemporaryDirectory(dir=package.parent) as scratch,
            compiling(host, Path(scratch)),
            warnings.catch_warnings(),
        ):
            # torch.export checks its own tree specs with the LeafSpec it deprecated: torch's
            # warning, nothing of ours, and no line for a user
            warnings.filterwarnings("ignore", _LEAF_SPEC, FutureWarning)
            exported = torch.export.export(matmul, (x,), dynamic_shapes=shapes)
            archive = torch._inductor.aoti_compile_and_package(
                exported, package_path=str(Path(scratch) / "graph.pt2")
            )
            partial = Path(scratch) / package.name
            with zipfile.ZipFile(archive) as files:
                (library,) = [name for name in files.namelist() if name.endswith(".wrapper.so")]
                with files.open(library) as source, partial.open("wb") as target:
                    shutil.copyfileobj(source, target)
            partial.replace(package)  # atomic: a crash never leaves half a library in place
        return _load(package)

    def _loaded(self, package: Path) -> Graph | None:
        """The graph saved in ``package``, the head's ``columns`` read from beside it if it
        has none yet; None where either is missing or does not load (compiled again)."""
        scales = package.parent / _SCALES
        if not package.exists() or not scales.exists():
            return None
        try:
            if self.columns is None:
                self.columns = _read_columns(scales, self.in_features)
            return _load(package)
        except Exception as error:
            reason = (str(error).splitlines() or [type(error).__name__])[0]
            log.info("int8 head: %s does not load, compiled again (%s)", package, reason)
            return None


def _save_scales(path: Path, columns: torch.Tensor, scales: torch.Tensor) -> None:
    """``columns`` and ``scales`` into ``path``, whole or not at all."""
    partial = path.with_name(path.name + ".partial")
    torch.save({"columns": columns, "scales": scales}, partial)
    partial.replace(path)


def _read_columns(path: Path, width: int) -> torch.Tensor:
    """The ``columns`` saved in ``path``; ``ValueError`` when they are not a head's of
    ``width`` columns."""
    columns = torch.load(path, weights_only=True)["columns"]
    if not isinstance(columns, torch.Tensor) or columns.shape != (width,):
        raise ValueError(f"{path} holds no columns of {width}")
    return columns.float()


def _load(package: Path) -> Graph:
    """The graph in the library ``package``: loaded, the weight copied out of it into the
    graph's buffer, and the library's pages read for that handed back (``mapped_pages.py``).

    The library alone, not the package ``aoti_load_package`` takes: that extracts it into a
    new temporary folder at each start (160 MB, left behind by a process that is killed) and
    checks the package's CPU against this one's, advice only (a log line), by probing each
    vector ISA with the C++ compiler (8 s on a busy 2-core host); the cache's key has the host
    class. The probe also asked the kernel for the AMX tiles' state, which an AMX kernel needs
    (without it: SIGILL): asked here (a no-op without AMX)."""
    torch.cpu._init_amx()
    before = mapped_files()
    runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(package), 1)
    drop_clean_pages(before)

    def graph(rows: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = runner.run([rows])[0]
        return out

    return graph


def prepare(model: Any, rows: int, cache_dir: Path) -> None:
    """Compile the int8 head of ``model``, if it has one, for calls of up to ``rows`` rows."""
    head = getattr(model, "lm_head", None)
    if isinstance(head, Int8Head):
        head.compile(rows, cache_dir)


@contextlib.contextmanager
def compiling(host: str, scratch: Path) -> Iterator[None]:
    """Inductor's settings while compiling: its config patched, one torch thread (see the top),
    its cache in ``scratch`` (the build's files; the package is what is kept) and its cache
    artifacts dropped after (it keeps each graph's bytes in memory, the reordered weight in
    them, for a caller that would ship them elsewhere), and off AMX where oneDNN is capped below
    it (so a cap stands for a CPU without AMX, ``precision.host_class``)."""
    import torch._inductor.config
    from torch._inductor import cpu_vec_isa
    from torch._inductor.utils import clear_caches
    from torch.compiler._cache import CacheArtifactManager

    if host != AMX:
        isas = cpu_vec_isa.valid_vec_isa_list()  # cached: the list Inductor picks from
        isas[:] = [isa for isa in isas if not isinstance(isa, cpu_vec_isa.VecAMX)]
    before, cache = torch.get_num_threads(), os.environ.get(_CACHE_VARIABLE)
    torch.set_num_threads(1)
    os.environ[_CACHE_VARIABLE] = str(scratch)
    clear_caches()  # read the folder just set
    try:
        with torch._inductor.config.patch(_COMPILE_CONFIG), CacheArtifactManager.with_fresh_cache():
            yield
    finally:
        torch.set_num_threads(before)
        if cache is None:
            os.environ.pop(_CACHE_VARIABLE, None)
        else:
            os.environ[_CACHE_VARIABLE] = cache
        clear_caches()
