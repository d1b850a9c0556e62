"""Gemma 3's attention and MLP with their projections packed together: one GEMM for the query,
key and value, one for the gate and the up projection.

A decode step multiplies a handful of rows by each weight, so a small projection costs about a
kernel call's overhead plus its bytes; three projections read once as one matrix cost the bytes
and one call. ``pack_model`` puts these modules in place of transformers' (``Gemma3Attention``,
``Gemma3MLP``) when it packs a Gemma 3 decoder; they take the same arguments and return the same
values, so ``generate``, the batched engine and transformers' own batching manager all run them.
The arithmetic is transformers': RMS norms in float32 with Gemma's ``1 + weight``, rotary
embeddings from the model's own cos/sin, the attention function the model is configured with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.gemma3.modeling_gemma3 import eager_attention_forward

Kernel = Callable[[nn.Linear], nn.Module]  # a packed Linear of packed.py, made from an nn.Linear


def _stacked(kernel: Kernel, *linears: nn.Linear) -> nn.Module:
    """One packed layer whose output is the outputs of ``linears``, side by side."""
    stacked = nn.Linear(linears[0].in_features, sum(x.out_features for x in linears), bias=False)
    if any(x.bias is not None for x in linears):
        raise ValueError("projections with a bias are not fused")
    stacked.weight = nn.Parameter(torch.cat([x.weight.detach() for x in linears]))
    return kernel(stacked)


def _rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMS norm: in float32, times ``1 + weight`` (``scale``), back to x's dtype."""
    return torch.rms_norm(x.float(), [x.shape[-1]], scale, eps).to(x.dtype)


def _norm_scale(norm: Any) -> torch.Tensor:
    weight: torch.Tensor = norm.weight.detach().float()
    return (1.0 + weight).contiguous()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class FusedAttention(nn.Module):
    """``Gemma3Attention`` with q, k and v in one packed GEMM; the rest as transformers has it:
    the cache's ``update`` and the attention function the model is configured with (sdpa, or a
    continuous-batching manager's paged one) read the attributes they read there."""

    def __init__(self, attention: Any, kernel: Kernel) -> None:
        super().__init__()
        self.config = attention.config
        if self.config.attn_logit_softcapping is not None:
            raise ValueError("attention logit softcapping is not supported")
        self.layer_idx: int = attention.layer_idx
        self.layer_type = attention.layer_type
        self.head_dim: int = attention.head_dim
        self.heads: int = self.config.num_attention_heads
        self.kv_heads: int = self.config.num_key_value_heads
        self.num_key_value_groups: int = attention.num_key_value_groups
        self.scaling: float = attention.scaling
        self.is_causal: bool = attention.is_causal
        self.sliding_window = attention.sliding_window
        self.eps: float = attention.q_norm.eps
        self.qkv = _stacked(kernel, attention.q_proj, attention.k_proj, attention.v_proj)
        self.o_proj = kernel(attention.o_proj)
        self.q_scale: torch.Tensor
        self.k_scale: torch.Tensor
        self.register_buffer("q_scale", _norm_scale(attention.q_norm), persistent=False)
        self.register_buffer("k_scale", _norm_scale(attention.k_norm), persistent=False)
        self._split = [self.heads * self.head_dim, *[self.kv_heads * self.head_dim] * 2]

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, Any]:
        rows, tokens = hidden_states.shape[:2]
        q, k, v = self.qkv(hidden_states).split(self._split, dim=-1)
        q = q.view(rows, tokens, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(rows, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(rows, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        q = _rms_norm(q, self.q_scale, self.eps)
        k = _rms_norm(k, self.k_scale, self.eps)
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        out, weights = attend(
            self,
            q,
            k,
            v,
            attention_mask,
            dropout=0.0,
            scaling=self.scaling,
            sliding_window=self.sliding_window,
            **kwargs,
        )
        out = out.reshape(rows, tokens, -1).contiguous()
        return self.o_proj(out), weights


class FusedMLP(nn.Module):
    """``Gemma3MLP`` with the gate and up projections in one packed GEMM."""

    def __init__(self, mlp: Any, kernel: Kernel) -> None:
        super().__init__()
        self.intermediate: int = mlp.intermediate_size
        self.gate_up = _stacked(kernel, mlp.gate_proj, mlp.up_proj)
        self.down_proj = kernel(mlp.down_proj)
        self.act_fn = mlp.act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).split([self.intermediate, self.intermediate], dim=-1)
        out: torch.Tensor = self.down_proj(self.act_fn(gate) * up)
        return out


def fuse_layer(layer: Any, kernel: Kernel) -> list[torch.Tensor]:
    """Put the fused modules in ``layer`` (a ``Gemma3DecoderLayer``); the weights they were
    made from, which the caller may hand back to the kernel."""
    attention, mlp = layer.self_attn, layer.mlp
    read = [
        m.weight
        for m in (
            attention.q_proj,
            attention.k_proj,
            attention.v_proj,
            attention.o_proj,
            mlp.gate_proj,
            mlp.up_proj,
            mlp.down_proj,
        )
    ]
    layer.self_attn = FusedAttention(attention, kernel)
    layer.mlp = FusedMLP(mlp, kernel)
    return read


def fusable(layer: Any) -> bool:
    """Whether ``layer`` is a Gemma 3 decoder layer these modules stand in for."""
    return (
        type(layer).__name__ == "Gemma3DecoderLayer"
        and type(layer.self_attn).__name__ == "Gemma3Attention"
        and type(layer.mlp).__name__ == "Gemma3MLP"
        and layer.self_attn.config.attn_logit_softcapping is None
    )
