"""Attention over ``SlotKV`` without masks: every kernel gives what SDPA gives with the masks.

flash-attn and PyTorch's varlen kernel need CUDA; here stand-ins with their contracts
(``tests/fakes/flash_attn.py``) sit where they are imported, assert the arguments the real
kernels require, and compute with plain torch. The batched engine on the tiny model then runs
with flash-attn's kernels behind it and replies token for token as ``generate`` does.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from wschat.server.engine.base import GenerationRequest
from wschat.server.engine.local import attention
from wschat.server.engine.local.attention import FULL, SLIDING
from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.hf import HFEngine
from wschat.server.engine.local.loader import LoadedModel
from wschat.server.engine.local.options import LocalEngineOptions
from wschat.server.engine.local.sequence_kv import LayerLayout
from wschat.server.engine.local.slotkv import SlotKV

from tests.engine.batch_runs import WIDTH, alone, greedy, prompts
from tests.fakes import flash_attn as fake
from tests.support import collect

WINDOW = 4
HEADS, KV_HEADS, DIM = 4, 2, 8
LAYOUT = LayerLayout((FULL, SLIDING), WINDOW, KV_HEADS, DIM, torch.float32, torch.device("cpu"))
MODULE = SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, is_causal=True, training=False)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[fake.Calls]:
    """flash-attn's stand-in where ``import flash_attn`` finds it, PyTorch's varlen likewise."""
    recorded = fake.Calls()
    monkeypatch.setitem(sys.modules, "flash_attn", fake.make(recorded))
    monkeypatch.setattr(attention, "_torch_varlen", lambda: fake.torch_varlen(recorded))
    yield recorded


def attend(kv: SlotKV, counts: list[int], generator: torch.Generator) -> list[torch.Tensor]:
    """One forward of random queries and keys: each layer's attention output, real tokens only."""
    positions, masks = kv.plan(counts)
    rows, width = positions.shape
    outs = []
    for layer, kind in enumerate(LAYOUT.kinds):
        q = torch.randn(rows, HEADS, width, DIM, generator=generator)
        k = torch.randn(rows, KV_HEADS, width, DIM, generator=generator)
        v = torch.randn(rows, KV_HEADS, width, DIM, generator=generator)
        keys, values = kv.update(k, v, layer)
        out, _ = attention.slot_attention(
            MODULE,  # type: ignore[arg-type]
            q,
            keys,
            values,
            masks[kind],
            fallback=sdpa_attention_forward,
            scaling=DIM**-0.5,
            sliding_window=WINDOW if kind == SLIDING else None,
            **kv.attention_kwargs(),
        )
        outs += [out[b, :n] for b, n in enumerate(counts)]
    kv.advance()
    return outs


# rows of different lengths: prefill chunks past the window (the ring wraps), a row that joins
# late, then decode steps
FORWARDS = [[3, 6, 1], [5, 2, 7], [1, 1, 1], [4, 1, 2], [1, 1, 1], [1, 1, 1]]


@pytest.mark.parametrize("kernel", [attention.FLASH_ATTN, attention.TORCH_VARLEN, attention.SDPA])
def test_each_kernel_attends_as_sdpa_with_the_masks(calls: fake.Calls, kernel: str) -> None:
    masked, free = SlotKV(LAYOUT, 3), SlotKV(LAYOUT, 3, kernel=kernel)
    for kv in (masked, free):
        for _ in range(3):
            kv.add()
    for counts in FORWARDS:
        seed = torch.Generator().manual_seed(len(masked.lengths) + sum(masked.lengths))
        expected = attend(masked, counts, seed)
        seed = torch.Generator().manual_seed(len(free.lengths) + sum(free.lengths))
        for got, want in zip(attend(free, counts, seed), expected, strict=True):
            torch.testing.assert_close(got, want)
    if kernel == attention.FLASH_ATTN:
        assert calls.kvcache and calls.varlen  # both kernels served the forwards
        # the last step at lengths 14, 11, 12: full layers read length + 1, rings their window
        assert calls.kvcache[-2]["cache_seqlens"] == [15, 12, 13]
        assert calls.kvcache[-1]["cache_seqlens"] == [WINDOW] * 3
    if kernel == attention.TORCH_VARLEN:
        assert calls.varlen and not calls.kvcache


def test_the_kernel_is_flash_attn_then_torch_varlen_on_cuda_in_half_precision(
    calls: fake.Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert attention.choose_kernel(cuda, torch.bfloat16) == attention.FLASH_ATTN
    assert attention.choose_kernel(cuda, torch.float32) == attention.MASKS  # no flash kernel
    assert attention.choose_kernel(cpu, torch.bfloat16) == attention.SDPA
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # not installed: import fails
    assert attention.choose_kernel(cuda, torch.float16) == attention.TORCH_VARLEN
    monkeypatch.setattr(attention, "_torch_varlen", lambda: None)  # a torch before 2.12
    assert attention.choose_kernel(cuda, torch.float16) == attention.MASKS


def test_installing_keeps_the_models_attention_name_and_stands_in_front_of_it_once(
    tiny_text_loaded: LoadedModel,
) -> None:
    # transformers keys on the name: the masks generate builds, which flash-attn it imports
    config = tiny_text_loaded.model.config.get_text_config()
    name = config._attn_implementation
    attention.install(config)
    attention.install(config)
    assert config._attn_implementation == name == "sdpa"
    ours = ALL_ATTENTION_FUNCTIONS[name]
    assert isinstance(ours, attention._StandIn)
    assert ours.fallback is sdpa_attention_forward


def test_the_cpu_decodes_one_row_without_a_mask_and_wider_batches_with_masks() -> None:
    kv = SlotKV(LAYOUT, 2, kernel=attention.SDPA)
    kv.add()
    kv.add()
    _, masks = kv.plan([1], first=1)
    assert masks[FULL] is None and kv.attention_kwargs()["slots"].kernel == attention.ROWS
    kv.advance()
    _, masks = kv.plan([1, 1])
    assert masks[FULL] is not None and kv.attention_kwargs() == {}
    kv.advance()
    _, masks = kv.plan([3])
    assert masks[FULL] is not None and kv.attention_kwargs() == {}


@pytest.mark.parametrize("kernel", [attention.FLASH_ATTN, attention.TORCH_VARLEN])
async def test_batched_greedy_replies_equal_generate_with_each_cuda_kernel_behind_the_engine(
    calls: fake.Calls,
    tiny_text_loaded: LoadedModel,
    monkeypatch: pytest.MonkeyPatch,
    kernel: str,
) -> None:
    monkeypatch.setattr(attention, "choose_kernel", lambda *_: kernel)
    steps = await replies_equal_generate(tiny_text_loaded, calls)
    layers = len(tiny_text_loaded.model.config.get_text_config().layer_types)
    if kernel == attention.FLASH_ATTN:  # kvcache every decode step, varlen every prefill
        assert len(calls.kvcache) == layers * steps.decode_steps
        assert len(calls.varlen) == layers * steps.prefill_forwards
        widest = max(len(call["cache_seqlens"]) for call in calls.kvcache)
    else:  # torch's varlen for both
        assert not calls.kvcache
        assert len(calls.varlen) == layers * (steps.decode_steps + steps.prefill_forwards)
        widest = max(len(call["cu_seqlens_q"]) - 1 for call in calls.varlen)
    assert widest > 1  # rows of different lengths attended together


async def replies_equal_generate(loaded: LoadedModel, calls: fake.Calls) -> BatchedEngine:
    """Eight prompts at once in the batched engine reply as ``generate`` does alone; the
    engine, for its counts of forwards."""
    batched = BatchedEngine(loaded, LocalEngineOptions(width=WIDTH, prefill_tokens=32))
    single = HFEngine(loaded)
    try:
        asks = prompts(batched, WIDTH)
        expected = [await alone(single, ids, greedy(24)) for ids in asks]
        assert not calls.kvcache and not calls.varlen  # generate keeps the model's attention
        replies = [batched.generate(GenerationRequest(ids, greedy(24))) for ids in asks]
        texts = [text for text, _ in await asyncio.gather(*(collect(g) for g in replies))]
        assert texts == expected
    finally:
        await batched.aclose()
        await single.aclose()
    return batched
