"""The int8 head (engine/local/int8head.py) against ``F.linear``, eager and compiled, within
the bound of its rounding; what it does when a compile fails or a call is not covered; and a
second start of a real server reading its compiled kernel from the cache."""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path

import pytest
import torch
import torch._inductor
import torch.nn.functional as F
from torch import nn
from wschat.server.engine.local import int8head, precision
from wschat.server.engine.local.int8head import MANY_ROWS, Int8Head, quantized
from wschat.server.engine.local.loader import load_model
from wschat.server.engine.local.packed import Fp16Linear
from wschat.server.engine.local.precision import Packing, packing_unavailable

from tests.support import TIMEOUT, command_until_ready, free_port

# The int8 head's error bound for output n: each weight is off by at most half its step, its
# row's scale times its column's, s_n c_k (round to nearest), so sum_k |x_k| s_n c_k / 2;
# bfloat16 rounds the input and the output by
# 2^-9 each, a share of sum_k |x_k w_nk| (2^-7 holds a 2x margin); float32 sums add little.
BF16_SHARE = 2.0**-7
START_TIMEOUT = 600.0  # a first compile on a loaded 2-core machine takes minutes


def assert_within_bound(head: Int8Head, linear: nn.Linear, x: torch.Tensor) -> None:
    with torch.inference_mode():
        got = head(x).double()
    weight = linear.weight.double()
    exact = F.linear(x.double(), weight)
    scales, columns = head.matmul.scales.double(), head.columns.double()
    bound = (x.double().abs() * columns).sum(-1, keepdim=True) * scales / 2
    bound += BF16_SHARE * F.linear(x.double().abs(), weight.abs())
    assert got.shape == exact.shape
    excess = (got - exact).abs() - bound
    assert excess.max().item() <= 1e-6, f"worst error past the bound by {excess.max():.3g}"


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache dir for the module's compiles: a test of a head another test compiled reads
    its graphs (seconds) rather than compiling them again (a minute each)."""
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture(autouse=True)
def amx_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which graphs a head compiles depends on the host's class (MANY_ROWS_GRAPH_CLASSES):
    these tests hold the AMX class's rules on any host; a test of another class pins its own."""
    monkeypatch.setattr(int8head, "host_class", lambda: precision.AMX)


def linear(rows: int = 96, columns: int = 64) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(columns, rows, bias=False)


def test_quantized_rows_are_within_half_a_step_of_the_weights() -> None:
    weight = torch.randn(300, 64) * torch.logspace(-3, 1, 300)[:, None]  # rows of every size
    weight[:, 5] *= 40  # a wide column
    q, scales, columns = quantized(weight)
    assert (q.dtype, scales.dtype, columns.dtype) == (torch.int8, torch.bfloat16, torch.float32)
    step = scales.float()[:, None] * columns[None, :]
    error = (q.float() * step - weight).abs()
    assert (error <= step / 2 * (1 + 1e-6)).all()
    assert int(q.abs().amax(1).min()) >= 126  # each row's largest magnitude uses the range
    assert columns.max() == 1 and columns[5] == 1 and columns.min() < 0.3


def test_quantizing_leaves_a_float32_weight_as_it_was() -> None:
    """The head's weight is the embedding's too (Gemma 3 ties them): a float32 checkpoint's
    must come out of quantizing unchanged."""
    weight = torch.randn(40, 64)
    before = weight.clone()
    quantized(weight)
    assert torch.equal(weight, before)


def test_a_wide_column_does_not_coarsen_the_others() -> None:
    """Each row's step on the narrow columns is a share of the wide column's range, as the
    square root evens them out: without ``columns`` it would be the wide column's alone."""
    weight = torch.randn(8, 64) * 0.01
    weight[:, 0] = 1.0  # the wide column: 100x the others
    q, _, _ = quantized(weight)
    narrow = q[:, 1:].float().abs().amax(1)
    assert narrow.min() >= 8  # about 127 / sqrt(100) levels, where per row alone gave 1-3


@pytest.mark.parametrize("shape", [(1, 64), (7, 64), (2, 5, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_eager_int8_head_matches_f_linear_within_its_rounding(
    shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    plain = linear()
    head = Int8Head(plain, dtype)
    torch.manual_seed(1)
    x = torch.randn(shape)
    with torch.inference_mode():
        assert head(x.to(dtype)).dtype == dtype
    assert_within_bound(head, plain, x.to(dtype).float())


def test_the_compiled_int8_head_gives_the_eager_kernels_outputs_and_hands_its_weight_back(
    kernels: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plain = linear()
    head, eager = Int8Head(plain, torch.float32), Int8Head(plain, torch.float32)
    with caplog.at_level(logging.INFO, logger="wschat.engine.int8head"):
        head.compile(4, kernels)
    assert (head.one, head.many, head.eager) == (True, True, False)
    assert head.widest == MANY_ROWS  # 4 asked for: the bound every width up to it shares
    assert re.search(
        rf"compiled for 1 row and 2 to {MANY_ROWS} rows in [\d.]+ s \(\d of 2 from the cache\)",
        caplog.text,
    )
    assert any((kernels / "inductor").iterdir())  # the cache is under the cache dir
    torch.manual_seed(2)
    for rows in (1, 2, 3, MANY_ROWS + 3):  # past the bound: in two calls
        x = torch.randn(rows, 64)
        with torch.no_grad():  # not inference mode: the head enters it for its graphs
            compiled = head(x)
            expected = eager(x)
        # the same bf16 inputs and float32 sums: one bf16 rounding of the output apart at most
        assert (compiled - expected).abs().max() <= 2**-8 * expected.abs().max()
        assert_within_bound(head, plain, x)
    assert "ran the eager kernel" not in caplog.text


def test_heads_prepared_for_other_widths_read_one_compiled_graph_from_the_cache(
    kernels: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Engines of any width up to MANY_ROWS share the cache's graphs: a start with another
    width compiles nothing (the suite's servers and engines pay one compile, not one each)."""
    plain = linear()
    Int8Head(plain, torch.float32).compile(4, kernels)
    with caplog.at_level(logging.INFO, logger="wschat.engine.int8head"):
        Int8Head(plain, torch.float32).compile(MANY_ROWS // 2, kernels)
    assert re.search(r"in [\d.]+ s \(2 of 2 from the cache\)", caplog.text), caplog.text


def test_a_graph_of_other_bounds_in_the_cache_is_not_read_back(
    kernels: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A head compiled for one row, then for more, where the cache holds the same weight's
    graph for fewer rows: it compiles its own (Inductor's key leaves the bounds out, and the
    narrower graph's guards would refuse these, leaving the eager kernel)."""
    plain = linear()
    Int8Head(plain, torch.float32).compile(MANY_ROWS + 8, kernels)
    head = Int8Head(plain, torch.float32)
    head.compile(1, kernels)
    with caplog.at_level(logging.WARNING, logger="wschat.engine.int8head"):
        head.compile(MANY_ROWS + 16, kernels)
    assert (head.one, head.many, head.widest) == (True, True, MANY_ROWS + 16)
    assert caplog.records == []


def test_a_head_whose_packages_are_in_the_cache_loads_them_without_tracing_or_compiling(
    kernels: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later start loads the saved packages: nothing is traced (exported or run through
    the compiler), the weight is not even quantized, and the graphs give the first head's
    outputs."""
    plain = linear()
    first = Int8Head(plain, torch.float32)
    first.compile(4, kernels)

    def refused(*args: object, **kwargs: object) -> object:
        raise RuntimeError("traced again")

    monkeypatch.setattr(torch, "compile", refused)
    monkeypatch.setattr(torch.export, "export", refused)
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", refused)
    monkeypatch.setattr(int8head, "quantized", refused)
    head = Int8Head(plain, torch.float32)
    with caplog.at_level(logging.INFO, logger="wschat.engine.int8head"):
        head.compile(4, kernels)
    assert (head.one, head.many, head.eager) == (True, True, False)
    assert re.search(r"in [\d.]+ s \(2 of 2 from the cache\)", caplog.text), caplog.text
    assert "compiling" not in caplog.text
    torch.manual_seed(4)
    for rows in (1, 5):
        x = torch.randn(rows, 64)
        with torch.inference_mode():
            assert torch.equal(head(x), first(x))


def test_two_rows_run_the_one_row_graph_once_each_not_the_many_rows_graph(
    kernels: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    narrow = Int8Head(linear(), torch.float32)
    narrow.compile(2, kernels)  # an engine two rows wide: the one-row graph serves every call
    assert (narrow.one, narrow.many, narrow.matmul) == (True, False, None)
    monkeypatch.setattr(int8head, "host_class", lambda: precision.AVX2)
    narrow.compile(2, kernels)  # nor is the eager kernel's weight made off AMX
    assert narrow.matmul is None
    monkeypatch.setattr(int8head, "host_class", lambda: precision.AMX)
    head, eager = Int8Head(linear(), torch.float32), Int8Head(linear(), torch.float32)
    head.compile(4, kernels)
    one, calls = head.compiled_one, []
    assert one is not None

    def counted(rows: torch.Tensor) -> torch.Tensor:
        calls.append(rows.shape[0])
        return one(rows)

    def refused(rows: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the many-rows graph ran")

    head.compiled_one, head.compiled_many = counted, refused
    x = torch.randn(2, 64)
    with torch.no_grad():
        got, expected = head(x), eager(x)
    assert calls == [1, 1]
    assert (got - expected).abs().max() <= 2**-8 * expected.abs().max()


def test_off_amx_wider_calls_run_the_eager_kernel_quantized_at_the_start(
    kernels: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On AVX512 without AMX and on AVX2 the many-rows graph is slower than the eager kernel:
    only the one-row graph is compiled, and the int8 weight the eager kernel reads is made at
    the start, not at a reply's first wide step."""
    monkeypatch.setattr(int8head, "host_class", lambda: precision.AVX2)
    plain = linear()
    head, eager = Int8Head(plain, torch.float32), Int8Head(plain, torch.float32)
    with caplog.at_level(logging.INFO, logger="wschat.engine.int8head"):
        head.compile(8, kernels)
    assert (head.one, head.many, head.eager) == (True, False, True)
    assert head.matmul is not None  # quantized now
    assert re.search(r"compiled for 1 row in [\d.]+ s", caplog.text), caplog.text
    torch.manual_seed(5)
    for rows in (1, 2, 5):
        x = torch.randn(rows, 64)
        with torch.no_grad():
            got, expected = head(x), eager(x)
        if rows > int8head.ONE_ROW_CALLS:
            assert torch.equal(got, expected)
        else:
            assert (got - expected).abs().max() <= 2**-8 * expected.abs().max()
        assert_within_bound(head, plain, x)


def test_a_head_compiled_for_one_row_keeps_its_weight_for_more(kernels: Path) -> None:
    plain = linear()
    head, eager = Int8Head(plain, torch.float32), Int8Head(plain, torch.float32)
    head.compile(1, kernels)
    assert (head.one, head.many, head.eager) == (True, False, True)
    x = torch.randn(3, 64)
    with torch.inference_mode():
        assert torch.equal(head(x), eager(x))


def test_a_head_with_other_weights_does_not_read_the_others_kernel(kernels: Path) -> None:
    """Two heads of one shape compiled into one cache dir: the second computes with its own
    weight (Inductor's own key would hand it the first one's, reordered with the kernel)."""
    torch.manual_seed(3)
    first, second = nn.Linear(64, 96, bias=False), nn.Linear(64, 96, bias=False)
    Int8Head(first, torch.float32).compile(1, kernels)
    head, eager = Int8Head(second, torch.float32), Int8Head(second, torch.float32)
    head.compile(1, kernels)
    x = torch.randn(1, 64)
    with torch.inference_mode():
        assert torch.equal(head(x), eager(x))


def test_a_call_the_compiled_head_fails_runs_eager_with_one_log_line(
    kernels: Path, caplog: pytest.LogCaptureFixture
) -> None:
    head, eager = Int8Head(linear(), torch.float32), Int8Head(linear(), torch.float32)
    head.compile(1, kernels)

    def refused(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("Detected recompile")

    head.compiled_one = refused
    x = torch.randn(1, 64)
    with caplog.at_level(logging.WARNING, logger="wschat.engine.int8head"):
        outside = [head(x) for _ in range(3)]
    with torch.inference_mode():
        expected = eager(x)
    assert all(torch.equal(out, expected) for out in outside)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["int8 head: a call ran the eager kernel (Detected recompile)"]


def test_a_compile_that_fails_leaves_the_eager_kernel_with_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> str:
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", broken)
    head, eager = Int8Head(linear(), torch.float32), Int8Head(linear(), torch.float32)
    with caplog.at_level(logging.WARNING, logger="wschat.engine.int8head"):
        head.compile(4, tmp_path)
    assert (head.one, head.many, head.eager) == (False, False, True)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "int8 head: compiling failed, its eager kernel runs instead (slower): no C++ compiler"
    ]
    x = torch.randn(3, 64)
    with torch.inference_mode():
        assert torch.equal(head(x), eager(x))


@pytest.mark.skipif(
    packing_unavailable(Packing.FBGEMM_FP16, "cpu") is not None, reason="fbgemm (x86) only"
)
def test_auto_keeps_a_small_head_in_its_packing_and_puts_it_in_int8_where_asked(
    tiny_text_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(precision, "host_class", lambda: "avx512")
    auto = load_model(str(tiny_text_dir), dtype="auto")  # a head of 262,144 x 64: 16M weights
    assert auto.precision_name == "fp16-int8"
    assert isinstance(auto.model.lm_head, Fp16Linear)
    asked = load_model(str(tiny_text_dir), dtype="fp16-int8head")
    assert isinstance(asked.model.lm_head, Int8Head)


async def test_a_second_start_reads_the_compiled_head_from_the_cache(
    tiny_text_dir: Path, tmp_path: Path
) -> None:
    """Two starts of a real server with the same cache dir: the first compiles the head's
    kernel into a package, the second loads it and compiles nothing (no time asserted)."""
    port = free_port()
    command = [sys.executable, "-m", "wschat.server", "--model", str(tiny_text_dir)]
    command += ["--port", str(port), "--dtype", "fp16-int8head", "--engine", "generate"]
    command += ["--cache-dir", str(tmp_path / "cache"), "--threads", "1"]
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    compiled = re.compile(r"int8 head: compiled for 1 row in [\d.]+ s \((\d) of 1 from the cache")
    hits = []
    for start in ("first", "second"):
        log = tmp_path / f"{start}.log"
        async with command_until_ready(command, port, log, env, START_TIMEOUT) as server:
            server.terminate()
            server.wait(TIMEOUT)
        found = compiled.search(log.read_text())
        assert found, log.read_text()
        hits.append(int(found.group(1)))
    assert hits == [0, 1]
    assert "compiling its kernel" not in log.read_text()  # the second start's
    assert len(list((tmp_path / "cache" / "inductor").glob("*/*/torch-*/1.so"))) == 1
