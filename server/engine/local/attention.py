"""Attention over ``SlotKV``'s rows given each row's lengths, with no 4-D mask.

A forward of the batched engine hands its ``SlotBatch`` (built by ``SlotKV.plan``) to the model
in the forward's kwargs (``slots=``); transformers passes it down to the attention function of
every layer, which is ours (``install`` registers it through ``AttentionInterface`` in place of
the model's own). Without a ``SlotBatch`` (``generate``'s forwards) it calls the function the
model was loaded with.

The kernels, by what is there:

- ``flash_attn``: flash-attn's ``flash_attn_with_kvcache`` for a decode step, straight over the
  slot buffers (per-row ``cache_seqlens``, GQA), and ``flash_attn_varlen_func`` for a prefill;
- ``torch_varlen``: PyTorch's ``varlen_attn`` (CUDA only) in the packed form for both, each
  layer's keys gathered into a packed copy (it reads no strided per-row cache);
- ``rows``: one SDPA call per row over its own columns, no mask;
- ``masks``: SDPA with the boolean masks ``SlotKV`` builds (the model's own attention function).

Sliding layers keep ``SlotKV``'s ring. In a decode step the ring holds exactly the positions the
new token reads (its own included), each already rotated by RoPE, so attention over it is a sum
that does not depend on the columns' order: the kernels read its first ``min(length + 1,
window)`` columns as if they were a linear cache and apply no window. A prefill reads the ring
unrolled in position order, then the new tokens, with a window of ``window - 1`` keys behind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.gemma3.modeling_gemma3 import eager_attention_forward

FULL = "full_attention"
SLIDING = "sliding_attention"

FLASH_ATTN = "flash_attn"
TORCH_VARLEN = "torch_varlen"
SDPA = "sdpa"  # the CPU's: ROWS for a one-row decode step, MASKS for the rest (kernel_for)
ROWS = "rows"
MASKS = "masks"


def choose_kernel(device: torch.device, dtype: torch.dtype) -> str:
    """The kernel a forward over ``device`` uses (``kernel_for`` may keep masks for a forward).

    On CUDA in fp16 or bf16 (all that flash kernels take): flash-attn when importable, else
    PyTorch's varlen kernel where this torch has it with a window and GQA, else the masks.
    Elsewhere SDPA (see kernel_for).
    """
    if device.type != "cuda":
        return SDPA
    if dtype not in (torch.float16, torch.bfloat16):
        return MASKS
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return TORCH_VARLEN if _torch_varlen() is not None else MASKS
    return FLASH_ATTN


def kernel_for(kernel: str, rows: int, width: int) -> str:
    """The kernel of one forward of ``rows`` rows of ``width`` tokens each.

    ``sdpa`` (the CPU) takes the one-row decode step mask-free (``rows``): one SDPA call over
    the row's own columns beats the masked call there, while for wider steps one masked call
    beats a call per row; a prefill keeps its masks too, having no mask-free form without a
    varlen kernel (``python -m bench.attention`` measures them).
    """
    if kernel != SDPA:
        return kernel
    return ROWS if rows == 1 and width == 1 else MASKS


def _torch_varlen() -> Callable[..., Any] | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    import inspect

    if not {"window_size", "enable_gqa"} <= set(inspect.signature(varlen_attn).parameters):
        return None
    return varlen_attn


@dataclass(frozen=True, slots=True)
class Keys:
    """Where each row's keys are in what a layer's ``SlotKV.update`` returns, packed:
    ``(rows[i], cols[i])`` is packed key ``i``; row ``b``'s keys are ``cu[b]:cu[b + 1]``."""

    rows: torch.Tensor  # long [total_k]
    cols: torch.Tensor  # long [total_k]
    cu: torch.Tensor  # int32 [batch + 1]
    longest: int


@dataclass(frozen=True, slots=True)
class SlotBatch:
    """One forward's rows as the attention kernels read them: per-row lengths, no masks."""

    kernel: str
    window: int
    decode: bool  # one token a row, already in its column (else a prefill: width > 1)
    seen: dict[str, list[int]]  # keys per row and layer kind a decode step reads
    seqlens: dict[str, torch.Tensor]  # the same, int32 [rows]
    # the packed form (a prefill, or a decode step for torch's varlen): where the real queries
    # are, and the keys each reads; made once a forward, read by every layer
    query_rows: torch.Tensor | None = None  # long [total_q]
    query_cols: torch.Tensor | None = None  # long [total_q]
    cu_q: torch.Tensor | None = None  # int32 [rows + 1]
    longest_q: int = 0
    keys: dict[str, Keys] | None = None


def install(text_config: Any) -> None:
    """Register our attention function under the name of the one the text layers were loaded
    with (``sdpa``, ``flash_attention_2``, ...), standing in for it: forwards without a
    ``SlotBatch`` (``generate``'s, the vision tower's) reach that one unchanged. The name stays,
    so what transformers keys on it (the masks ``generate`` builds, which flash-attn it imports,
    continuous batching's checks) is as before.
    """
    name = text_config._attn_implementation
    if name is None:
        raise ValueError("the model names no attention implementation")
    current = ALL_ATTENTION_FUNCTIONS.get_interface(name, eager_attention_forward)
    if not isinstance(current, _StandIn):
        AttentionInterface.register(name, _StandIn(current))


class _StandIn:
    """Our attention function in front of the model's own (``fallback``)."""

    def __init__(self, fallback: Callable[..., tuple[torch.Tensor, Any]]) -> None:
        self.fallback = fallback

    def __call__(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, Any]:
        return slot_attention(
            module, query, key, value, attention_mask, fallback=self.fallback, **kwargs
        )


def slot_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    fallback: Callable[..., tuple[torch.Tensor, Any]],
    scaling: float | None = None,
    sliding_window: int | None = None,
    slots: SlotBatch | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention contract: ``query`` ``[rows, heads, width, dim]``, ``key`` and
    ``value`` what ``SlotKV.update`` returned; the output ``[rows, width, heads, dim]``."""
    if slots is None or slots.kernel == MASKS:
        out, _ = fallback(
            module,
            query,
            key,
            value,
            attention_mask,
            scaling=scaling,
            sliding_window=sliding_window,
            **kwargs,
        )
        return out, None
    kind = SLIDING if sliding_window else FULL
    if slots.decode:
        return _decode(slots, kind, query, key, value, scaling), None
    # a prefill: the real queries and each row's keys packed, in position order
    assert slots.keys is not None and slots.cu_q is not None
    assert slots.query_rows is not None and slots.query_cols is not None
    if slots.kernel not in (FLASH_ATTN, TORCH_VARLEN):
        raise ValueError(f"no prefill without masks for the {slots.kernel!r} kernel")
    keys = slots.keys[kind]
    q = query.transpose(1, 2)[slots.query_rows, slots.query_cols]  # [total_q, heads, dim]
    k = key.transpose(1, 2)[keys.rows, keys.cols]  # [total_k, kv_heads, dim]
    v = value.transpose(1, 2)[keys.rows, keys.cols]
    window = slots.window if kind == SLIDING else 0
    packed = _varlen(
        slots.kernel, q, k, v, slots.cu_q, keys.cu, slots.longest_q, keys.longest, scaling, window
    )
    rows, _, width, _ = query.shape
    out = packed.new_zeros((rows, width, *packed.shape[1:]))  # padded queries read nothing
    out[slots.query_rows, slots.query_cols] = packed
    return out, None


def _decode(
    slots: SlotBatch,
    kind: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor:
    if slots.kernel == FLASH_ATTN:
        from flash_attn import flash_attn_with_kvcache

        # [rows, columns, kv_heads, dim] views of the slot buffers: no copy, the last dim
        # contiguous as the kernel asks; each row reads its first cache_seqlens columns.
        out: torch.Tensor = flash_attn_with_kvcache(
            query.transpose(1, 2),
            key.transpose(1, 2),
            value.transpose(1, 2),
            cache_seqlens=slots.seqlens[kind],
            softmax_scale=scaling,
            causal=True,
        )
        return out
    if slots.kernel == TORCH_VARLEN:  # gathers each row's keys: varlen takes them packed
        assert slots.keys is not None and slots.cu_q is not None
        keys = slots.keys[kind]
        packed = _varlen(
            slots.kernel,
            query.transpose(1, 2)[:, 0],
            key.transpose(1, 2)[keys.rows, keys.cols],
            value.transpose(1, 2)[keys.rows, keys.cols],
            slots.cu_q,
            keys.cu,
            1,
            keys.longest,
            scaling,
            window=0,
        )
        return packed[:, None]
    outs = [
        functional.scaled_dot_product_attention(
            query[b : b + 1],
            key[b : b + 1, :, :n],
            value[b : b + 1, :, :n],
            scale=scaling,
            enable_gqa=True,
        )
        for b, n in enumerate(slots.seen[kind])
    ]
    return torch.cat(outs).transpose(1, 2)


def _varlen(
    kernel: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    longest_q: int,
    longest_k: int,
    scaling: float | None,
    window: int,
) -> torch.Tensor:
    """Causal attention of packed rows, the queries the last of each row's keys (bottom-right
    aligned); ``window`` > 0 lets a query see only the ``window - 1`` keys before its own."""
    span = (window - 1, 0) if window > 0 else (-1, 0)
    if kernel == TORCH_VARLEN:
        varlen = _torch_varlen()
        assert varlen is not None, "no varlen kernel in this torch"
        packed: torch.Tensor = varlen(
            q, k, v, cu_q, cu_k, longest_q, longest_k, scale=scaling, window_size=span,
            enable_gqa=True,
        )  # fmt: skip
        return packed
    from flash_attn import flash_attn_varlen_func

    out: torch.Tensor = flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, longest_q, longest_k, softmax_scale=scaling, causal=True,
        window_size=span,
    )  # fmt: skip
    return out


def _offsets(counts: torch.Tensor) -> torch.Tensor:
    """``[0, c0, c0 + c1, ...]`` as int32: the cumulative form varlen kernels take."""
    zero = torch.zeros(1, dtype=torch.int32, device=counts.device)
    return torch.cat([zero, torch.cumsum(counts, 0, dtype=torch.int32)])


def offsets(counts: list[int], device: torch.device) -> torch.Tensor:
    return _offsets(torch.tensor(counts, dtype=torch.int32, device=device))
