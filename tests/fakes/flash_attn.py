"""Stand-ins for flash-attn's two kernels (and PyTorch's ``varlen_attn``) with their contracts.

Each call asserts what the real kernel requires of its arguments (shapes, dtypes, strides,
int32 cumulative offsets of length ``rows + 1`` that start at 0 and never decrease, per-row
``cache_seqlens`` within the cache), records them, and computes the attention with plain torch:
each query is the last of its row's keys (bottom-right causal, as flash-attn aligns it),
optionally within a window of ``left`` keys behind. Installed as ``sys.modules["flash_attn"]``
by the tests, so the attention module imports these where it would import the real ones.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch.nn import functional

# The real kernels take fp16 and bf16 only; float32 is let through so the CPU tests compare with
# generate's float32 arithmetic token for token.
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass
class Calls:
    kvcache: list[dict[str, Any]] = field(default_factory=list)
    varlen: list[dict[str, Any]] = field(default_factory=list)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, left: int
) -> torch.Tensor:
    """One row: ``q`` [queries, heads, dim], ``k``/``v`` [keys, kv_heads, dim]."""
    queries, keys = q.shape[0], k.shape[0]
    at = torch.arange(queries)[:, None] + (keys - queries)  # each query's own key
    j = torch.arange(keys)[None, :]
    allowed = j <= at
    if left >= 0:
        allowed &= j >= at - left
    out = functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None].float(),
        k.transpose(0, 1)[None].float(),
        v.transpose(0, 1)[None].float(),
        attn_mask=allowed.to(q.device),
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1).to(q.dtype)


def _check_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    assert q.dtype == k.dtype == v.dtype and q.dtype in DTYPES, (q.dtype, k.dtype, v.dtype)
    assert k.shape == v.shape, (k.shape, v.shape)
    assert q.shape[-1] == k.shape[-1] <= 256, (q.shape, k.shape)
    assert q.shape[-2] % k.shape[-2] == 0, "query heads must be a multiple of kv heads"
    for t in (q, k, v):
        assert t.stride(-1) == 1, "the last dim must be contiguous"


def _check_offsets(cu: torch.Tensor, rows: int, total: int, longest: int) -> None:
    assert cu.dtype == torch.int32 and cu.dim() == 1, (cu.dtype, cu.shape)
    assert cu.shape[0] == rows + 1, (cu.shape, rows)
    counts = cu[1:] - cu[:-1]
    assert int(cu[0]) == 0 and bool((counts >= 0).all()), cu
    assert int(cu[-1]) == total, (cu, total)
    assert longest >= int(counts.max()), (longest, counts)


def make(calls: Calls) -> types.ModuleType:
    module = types.ModuleType("flash_attn")

    def flash_attn_with_kvcache(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        k: torch.Tensor | None = None,
        v: torch.Tensor | None = None,
        *,
        cache_seqlens: torch.Tensor | None = None,
        softmax_scale: float | None = None,
        causal: bool = False,
        window_size: tuple[int, int] = (-1, -1),
        softcap: float = 0.0,
        **rest: Any,
    ) -> torch.Tensor:
        assert k is None and v is None and not rest, "only the read of a written cache here"
        assert q.dim() == 4 and k_cache.dim() == 4, (q.shape, k_cache.shape)
        _check_heads(q, k_cache, v_cache)
        rows, width = q.shape[:2]
        assert cache_seqlens is not None
        assert cache_seqlens.dtype == torch.int32 and cache_seqlens.shape == (rows,)
        assert k_cache.shape[0] >= rows
        assert bool((cache_seqlens >= width).all())
        assert bool((cache_seqlens <= k_cache.shape[1]).all()), (cache_seqlens, k_cache.shape)
        calls.kvcache.append(
            {"rows": rows, "cache_seqlens": cache_seqlens.tolist(), "window": window_size}
        )
        left = window_size[0] if causal else -1
        outs = [
            _attend(q[b], k_cache[b, :n], v_cache[b, :n], softmax_scale, left)
            for b, n in enumerate(cache_seqlens.tolist())
        ]
        return torch.stack(outs)

    def flash_attn_varlen_func(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        max_seqlen_q: int,
        max_seqlen_k: int,
        dropout_p: float = 0.0,
        softmax_scale: float | None = None,
        causal: bool = False,
        window_size: tuple[int, int] = (-1, -1),
        **rest: Any,
    ) -> torch.Tensor:
        assert dropout_p == 0.0 and not rest.get("block_table")
        assert q.dim() == 3 and k.dim() == 3, (q.shape, k.shape)
        _check_heads(q, k, v)
        rows = cu_seqlens_q.shape[0] - 1
        _check_offsets(cu_seqlens_q, rows, q.shape[0], max_seqlen_q)
        _check_offsets(cu_seqlens_k, rows, k.shape[0], max_seqlen_k)
        calls.varlen.append(
            {
                "cu_seqlens_q": cu_seqlens_q.tolist(),
                "cu_seqlens_k": cu_seqlens_k.tolist(),
                "window": window_size,
            }
        )
        assert causal and window_size[1] == 0
        out = q.new_empty(q.shape)
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        for b in range(rows):
            keys = slice(ck[b], ck[b + 1])
            assert ck[b + 1] - ck[b] >= cq[b + 1] - cq[b], "fewer keys than queries"
            out[cq[b] : cq[b + 1]] = _attend(
                q[cq[b] : cq[b + 1]], k[keys], v[keys], softmax_scale, window_size[0]
            )
        return out

    module.flash_attn_with_kvcache = flash_attn_with_kvcache  # type: ignore[attr-defined]
    module.flash_attn_varlen_func = flash_attn_varlen_func  # type: ignore[attr-defined]
    return module


def torch_varlen(calls: Calls) -> Any:
    """A stand-in for ``torch.nn.attention.varlen.varlen_attn`` (CUDA only in torch)."""
    fake = make(calls)
    real: Callable[..., Any] | None
    try:
        from torch.nn.attention import varlen

        real = cast("Callable[..., Any]", varlen.varlen_attn)  # its signature varies by torch
    except ImportError:
        real = None

    def varlen_attn(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        cu_seq_q: torch.Tensor,
        cu_seq_k: torch.Tensor,
        max_q: int,
        max_k: int,
        *,
        scale: float | None = None,
        window_size: tuple[int, int] = (-1, -1),
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        assert enable_gqa or query.shape[1] == key.shape[1]
        if real is not None:  # the real one's own checks, on meta copies (it runs on CUDA only)
            meta = [t.to("meta") for t in (query, key, value, cu_seq_q, cu_seq_k)]
            shape = real(
                *meta, max_q, max_k, scale=scale, window_size=window_size, enable_gqa=enable_gqa
            ).shape
            assert shape == query.shape, (shape, query.shape)
        out: torch.Tensor = fake.flash_attn_varlen_func(
            query, key, value, cu_seq_q, cu_seq_k, max_q, max_k,
            softmax_scale=scale, causal=True, window_size=window_size,
        )  # fmt: skip
        return out

    return varlen_attn
