"""Packed Linear layers against ``F.linear`` (random and the embedded model's real weights, each
within the error bound of its rounding), ``pack_model`` on the tiny models, ``page_out``, and the
embedded model's perplexity with packed weights against float32's."""

from __future__ import annotations

import copy
import math
import re
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from wschat.server.engine.local import packed as packed_module
from wschat.server.engine.local.embedded_model import embedded_model_dir
from wschat.server.engine.local.fused import FusedAttention, FusedMLP, fuse_layer
from wschat.server.engine.local.loader import LoadedModel, load_model
from wschat.server.engine.local.packed import (
    INT8_STEP_ROWS,
    Fp16Linear,
    Int8StepLinear,
    OnednnBf16Linear,
    WidenedEmbedding,
    page_out,
)
from wschat.server.engine.local.precision import Packing, packing_unavailable

from tests.support import TIMEOUT

# Each kernel's error bound, as a share of sum_k |x_k w_k| (the worst the rounding can do):
# fp16 weights round each weight by at most 2^-11 of itself, float32 arithmetic adds little;
# bf16 rounds the input, the weight and the output by 2^-8 each. Both bounds hold a 2x margin.
FP16_BOUND = 2.0**-10
BF16_BOUND = 2.0**-6
KERNELS = {
    Packing.FBGEMM_FP16: (Fp16Linear, FP16_BOUND),
    Packing.ONEDNN_BF16: (OnednnBf16Linear, BF16_BOUND),
}
needs = {
    packing: pytest.mark.skipif(
        packing_unavailable(packing, "cpu") is not None,
        reason=str(packing_unavailable(packing, "cpu")),
    )
    for packing in Packing
}
each_kernel = pytest.mark.parametrize(
    "packing", [pytest.param(p, marks=needs[p], id=p.value) for p in Packing]
)


def assert_within_bound(linear: nn.Linear, packing: Packing, x: torch.Tensor) -> None:
    kind, bound = KERNELS[packing]
    packed = kind(linear)
    inputs = x if packing is Packing.FBGEMM_FP16 else x.bfloat16()
    with torch.no_grad():
        got = packed(inputs).float()
        exact = F.linear(x.double(), linear.weight.double(), _double(linear.bias))
        scale = F.linear(x.double().abs(), linear.weight.double().abs(), _abs(linear.bias))
    assert got.shape == exact.shape
    excess = (got.double() - exact).abs() - bound * scale
    assert excess.max().item() <= 1e-6, f"worst error past the bound by {excess.max():.3g}"


def _double(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None else bias.double()


def _abs(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None else bias.double().abs()


@each_kernel
@pytest.mark.parametrize("bias", [False, True])
# rows of a step, a batch, a prompt, a prefill chunk (oneDNN and fbgemm pick their kernels by rows)
@pytest.mark.parametrize("shape", [(1, 64), (7, 64), (2, 5, 64), (512, 64)])
def test_a_packed_linear_matches_f_linear_within_its_rounding(
    packing: Packing, bias: bool, shape: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=bias)
    assert_within_bound(linear, packing, torch.randn(shape))


@each_kernel
def test_a_packed_linear_says_its_shape_and_kernel(packing: Packing) -> None:
    packed = KERNELS[packing][0](nn.Linear(8, 3))
    assert (packed.in_features, packed.out_features) == (8, 3)
    assert packing.value.split("-")[0] in repr(packed)


@pytest.mark.real_model
@each_kernel
@pytest.mark.parametrize(
    "name", ["model.layers.0.self_attn.q_proj.weight", "model.layers.17.mlp.down_proj.weight"]
)
def test_packed_real_layers_match_f_linear_within_their_rounding(
    packing: Packing, name: str
) -> None:
    from safetensors import safe_open

    with safe_open(embedded_model_dir() / "model.safetensors", framework="pt") as weights:
        weight = weights.get_tensor(name).float()
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight = nn.Parameter(weight)
    torch.manual_seed(1)
    assert_within_bound(linear, packing, torch.randn(3, weight.shape[1]))


@each_kernel
@pytest.mark.parametrize("bias", [False, True])
# one or two rows (a decode step, alone or beside another): the int8 copy; more: the packing
@pytest.mark.parametrize("shape", [(1, 64), (2, 64), (2, 1, 64), (3, 64), (2, 5, 64), (512, 64)])
def test_an_int8_step_linear_reads_its_int8_copy_for_narrow_steps_and_its_packing_past(
    packing: Packing, bias: bool, shape: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=bias)
    step = Int8StepLinear(linear, KERNELS[packing][0])
    x = torch.randn(shape)
    x = x if packing is Packing.FBGEMM_FP16 else x.bfloat16()
    rows = x.numel() // 64
    with torch.no_grad():
        got = step(x)
        assert got.shape == (*shape[:-1], 96) and got.dtype == x.dtype
        if rows > INT8_STEP_ROWS:
            assert torch.equal(got, step.wide(x))
            return
        flat = x.reshape(rows, 64).bfloat16()
        product = torch.ops.aten._weight_int8pack_mm(flat, step.weight, step.scales)
        if bias:
            product = product + linear.bias.bfloat16()
        assert torch.equal(got.reshape(rows, 96), product.to(x.dtype))
        # each weight within half its row's step; bf16 rounds the input, the output (and the
        # bias) by 2^-9 each: 2^-7 of sum_k |x_k w_k| holds a 2x margin
        exact = F.linear(flat.double(), linear.weight.double(), _double(linear.bias))
        half_steps = flat.double().abs().sum(-1, keepdim=True) * step.scales.double() / 2
        scale = F.linear(flat.double().abs(), linear.weight.double().abs(), _abs(linear.bias))
        excess = (got.reshape(rows, 96).double() - exact).abs() - half_steps - 2**-7 * scale
        assert excess.max().item() <= 1e-6, f"worst error past the bound by {excess.max():.3g}"


def test_a_widened_embedding_looks_up_the_saved_rows_and_scales_them_in_float32() -> None:
    table = nn.Embedding(10, 4, padding_idx=0).to(torch.bfloat16)
    table.scalar_embed_scale = 2.0  # type: ignore[assignment]  # as Gemma's scaled embedding
    widened = WidenedEmbedding(table, torch.float32)
    ids = torch.tensor([[3, 0, 9]])
    rows = widened(ids)
    assert rows.dtype == torch.float32
    assert torch.equal(rows, table.weight[ids].float() * 2.0)
    assert not list(widened.parameters())  # a buffer: the model's dtype stays the compute one


def layers_of(module: nn.Module, kind: type[nn.Module]) -> int:
    return sum(isinstance(m, kind) for m in module.modules())


@pytest.fixture(scope="module")
def tiny_fp16(tiny_text_dir: Path) -> LoadedModel:
    if packing_unavailable(Packing.FBGEMM_FP16, "cpu"):
        pytest.skip(str(packing_unavailable(Packing.FBGEMM_FP16, "cpu")))
    return load_model(str(tiny_text_dir), dtype="fp16-weights")


def test_fp16_weights_pack_every_linear_and_the_head_and_compute_in_float32(
    tiny_fp16: LoadedModel,
) -> None:
    model = tiny_fp16.model
    assert layers_of(model, nn.Linear) == 0
    assert isinstance(model.lm_head, Fp16Linear)
    layers = model.config.num_hidden_layers
    assert layers_of(model, FusedAttention) == layers_of(model, FusedMLP) == layers
    assert layers_of(model, Fp16Linear) == 1 + 4 * layers  # qkv, o, gate_up, down; the head
    assert model.dtype == tiny_fp16.dtype == torch.float32
    assert tiny_fp16.precision_name == "fp16-weights"


def test_fp16_weights_give_the_float32_models_logits_within_rounding(
    tiny_fp16: LoadedModel, tiny_text_loaded: LoadedModel
) -> None:
    ids = torch.tensor([[2, *range(300, 340)]])
    with torch.inference_mode():
        packed = tiny_fp16.model(input_ids=ids).logits
        exact = tiny_text_loaded.model(input_ids=ids).logits
    assert torch.equal(packed.argmax(-1), exact.argmax(-1))
    assert (packed - exact).abs().max() <= 1e-2 * exact.abs().max()


def test_fused_layers_give_the_outputs_of_transformers_layers(
    tiny_text_loaded: LoadedModel,
) -> None:
    """With float32 kernels (nn.Linear itself) the fused attention and MLP compute what
    transformers' modules compute: a prefill, then decode steps over the same cache kind."""
    from transformers import DynamicCache

    reference = tiny_text_loaded.model
    fused = copy.deepcopy(reference)
    for layer in fused.model.layers:
        fuse_layer(layer, lambda linear: linear)
    prompt = torch.tensor([[2, *range(400, 440)]])  # past the sliding window (16)
    pairs = [(m, DynamicCache(config=m.config)) for m in (reference, fused)]
    with torch.inference_mode():
        outs = [m(input_ids=prompt, cache=c) for m, c in pairs]
        for _ in range(20):
            assert torch.allclose(outs[0].logits, outs[1].logits, atol=1e-5, rtol=1e-4)
            token = outs[0].logits[:, -1:].argmax(-1)
            outs = [m(input_ids=token, cache=c) for m, c in pairs]


def test_transformers_batching_manager_runs_the_fused_layers_as_generate_does(
    tiny_fp16: LoadedModel,
) -> None:
    """The fused attention reads the cache and attention function a caller configured: the
    continuous-batching manager's paged ones give generate's greedy tokens."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    model, prompt = tiny_fp16.model, [2, *range(300, 320)]
    greedy = {"do_sample": False, "eos_token_id": [1], "pad_token_id": 0}
    manager = model.init_continuous_batching(
        generation_config=GenerationConfig(max_new_tokens=8, **greedy),
        # a cache for this one request: sized from the host's free memory otherwise, which
        # takes seconds to set up on a CPU
        continuous_batching_config=ContinuousBatchingConfig(
            page_size=32, num_blocks=4, max_batch_tokens=64
        ),
    )
    manager.start()
    try:
        request = manager.add_request(prompt, max_new_tokens=8)
        deadline = time.monotonic() + TIMEOUT
        while (out := manager.get_result(request_id=request, timeout=1)) is None or not (
            out.is_finished()
        ):
            assert time.monotonic() < deadline, "the manager gave no finished result"
    finally:
        manager.stop(block=True)
    with torch.inference_mode():
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=8, **greedy)
    assert out.generated_tokens == expected[0, len(prompt) :].tolist()


def test_the_vision_tower_keeps_plain_weights_and_the_text_decoder_is_packed(
    tiny_vision_dir: Path,
) -> None:
    if packing_unavailable(Packing.FBGEMM_FP16, "cpu"):
        pytest.skip(str(packing_unavailable(Packing.FBGEMM_FP16, "cpu")))
    model = load_model(str(tiny_vision_dir), dtype="fp16-weights").model
    assert layers_of(model.model.vision_tower, nn.Linear) > 0
    assert layers_of(model.model.language_model, nn.Linear) == 0
    assert isinstance(model.lm_head, Fp16Linear)
    assert model.model.vision_tower.dtype == torch.float32


def rss_file_bytes() -> int:
    status = Path("/proc/self/status").read_text()
    match = re.search(r"RssFile:\s+(\d+) kB", status)
    assert match, "no RssFile in /proc/self/status"
    return int(match.group(1)) * 1024


def test_page_out_hands_back_a_mapped_files_pages_and_keeps_every_value(
    tmp_path: Path,
) -> None:
    values = torch.arange(16 << 20, dtype=torch.float32)  # 64 MiB
    path = tmp_path / "weights.bin"
    values.numpy().tofile(path)
    mapped = torch.from_file(str(path), shared=False, size=values.numel(), dtype=torch.float32)
    assert torch.equal(mapped, values)  # every page read: resident
    before = rss_file_bytes()
    page_out([mapped])
    assert before - rss_file_bytes() >= 32 << 20
    assert torch.equal(mapped, values)


def test_page_out_keeps_the_values_of_memory_no_file_backs() -> None:
    values = torch.randn(1 << 20)
    kept = values.clone()
    page_out([values, values[3:5]])
    assert torch.equal(values, kept)


# A fixed passage of plain prose: the same tokens in every run, whatever else changes.
PASSAGE = """\
The river town woke slowly in winter. Before the sun rose over the hills, the baker lit his
ovens, and the smell of bread drifted down the narrow streets toward the water. Fishermen checked
their nets by lantern light, talking in low voices about the weather and the price of fuel. By
seven the first bus crossed the old stone bridge, carrying students to the school on the far
bank, and the ferry sounded its horn twice as it left the pier.

The town had grown up around the bridge. For centuries it was the only crossing for many miles,
and merchants paid a toll to bring their goods across. The toll house still stands at the
eastern end, now a small museum with maps, coins and a ledger in which a clerk once recorded
every cart, horse and traveller. Visitors like to find their own family names in its pages.

In the nineteenth century a railway reached the valley, and the town changed quickly. Factories
were built along the river to make paper and cloth, and workers arrived from the countryside to
fill them. Rows of brick houses climbed the hillside, each with a small garden and a chimney.
When the factories closed a hundred years later, many families moved away, and for a time the
streets were quiet and half the shops were empty.

Today the town is known for its market, which fills the main square every Saturday. Farmers sell
apples, cheese and honey; a woman from the hills brings wool dyed with plants she gathers
herself; and a man who repairs clocks sets up a table covered in tiny gears and springs. In the
afternoon musicians play near the fountain, and children chase pigeons between the stalls while
their parents drink coffee and talk with neighbours they have known all their lives.
"""
PERPLEXITY_TOLERANCE = 0.005  # packed weights: within 0.5% of float32's perplexity


def perplexity(loaded: LoadedModel) -> float:
    """exp of the mean cross-entropy of each next token of PASSAGE, after <bos>."""
    ids = loaded.tokenizer(PASSAGE, return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = loaded.model(input_ids=ids).logits.float()
    loss = F.cross_entropy(logits[0, :-1], ids[0, 1:])
    return math.exp(loss.item())


@pytest.mark.real_model
@pytest.mark.parametrize(
    "dtype",
    [
        pytest.param("fp16-weights", marks=needs[Packing.FBGEMM_FP16]),
        pytest.param("bf16-packed", marks=needs[Packing.ONEDNN_BF16]),
        pytest.param("fp16-int8head", marks=needs[Packing.FBGEMM_FP16]),
        pytest.param("bf16-int8head", marks=needs[Packing.ONEDNN_BF16]),
        pytest.param("fp16-int8", marks=needs[Packing.FBGEMM_FP16]),
        pytest.param("bf16-int8", marks=needs[Packing.ONEDNN_BF16]),
        "auto",
    ],
)
def test_packed_weights_keep_the_embedded_models_perplexity_within_half_a_percent(
    dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    exact = perplexity(load_model("embedded", dtype="float32"))
    # the passage in one forward, its every row through the int8 copies where the dtype has
    # them: what decode steps multiply by
    monkeypatch.setattr(packed_module, "INT8_STEP_ROWS", 1 << 20)
    loaded = load_model("embedded", dtype=dtype)
    loaded.prepare(8)  # an int8 head compiled: its forward, as the engines run it
    packed = perplexity(loaded)
    assert exact < 100, f"float32 perplexity {exact:.1f}: the passage reads as noise"
    assert abs(packed / exact - 1) <= PERPLEXITY_TOLERANCE, (packed, exact)
