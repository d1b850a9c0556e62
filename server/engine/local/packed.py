"""Linear layers whose weights are packed once for a CPU kernel (``precision.py`` says which and
why), and the model surgery that puts them in place.

``pack_model`` replaces every ``nn.Linear`` of the text decoder and the output head (a Gemma 3
decoder layer's projections fused, ``fused.py``; the head in int8 where the precision says so,
``int8head.py``). Gemma 3 ties
the head to the embedding; once the head has a packed copy of its own, the embedding is only a
lookup table, left in the dtype it was saved in: a step reads a few of its rows, not all of them.
The vision tower keeps plain weights: it multiplies thousands of patch rows at once, where the
packed layouts gain nothing over plain bf16 and fbgemm's fp16 loses to float32.

transformers maps a checkpoint's file into memory when its dtype is the one asked for, so the
weights that were packed still sit in this process's memory as file pages once read; they are
handed back to the kernel (``page_out``) as soon as their packed copies exist, and so are the
heap pages the packing's temporary copies freed.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import mmap
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .fused import fusable, fuse_layer
from .int8head import ACTIVATIONS, Int8Head, quantized
from .precision import Packing, Precision

log = logging.getLogger("wschat.engine.packed")

# The row count oneDNN's weight layout is tuned for: a decode step multiplies a few rows, a
# prefill chunk hundreds; a layout for 128 serves both about as well as the best for each.
ONEDNN_ROWS_HINT = 128
# The most rows a step multiplies by a layer's int8 copy (Int8StepLinear): past them the packed
# kernel's multiply costs more than the bytes the int8 copy saves
INT8_STEP_ROWS = 2
_MADV_PAGEOUT = 21  # Linux 5.4: reclaim the pages now; file pages are re-read if touched again


class Fp16Linear(nn.Module):
    """``F.linear`` with the weight in float16, packed once for fbgemm; float32 in and out."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.packed = torch.ops.quantized.linear_prepack_fp16(linear.weight.detach().float(), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.quantized.linear_dynamic_fp16(x, self.packed)
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fbgemm fp16"


class OnednnBf16Linear(nn.Module):
    """``F.linear`` in bfloat16 with the weight reordered once into oneDNN's blocked layout."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().to(torch.bfloat16).contiguous()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, ONEDNN_ROWS_HINT)
        self.bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x, self.packed, self.bias, "none", [], ""
        )
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, onednn bf16"


class Int8StepLinear(nn.Module):
    """A packed Linear (``wide``) for prefill chunks and wide steps, and an int8 copy of its
    weight (one scale per output row: ``aten._weight_int8pack_mm``, bfloat16 rows) for steps
    of at most ``INT8_STEP_ROWS`` rows. Such a step reads each weight once for a row or two, so
    its time is the weight's bytes, and the int8 copy has half of them; the kernel widens each
    int8 value for every row, so wider steps and prefill keep the packed layout."""

    def __init__(self, linear: nn.Linear, wide: Callable[[nn.Linear], nn.Module]) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.wide = wide(linear)
        q, scales, _ = quantized(linear.weight.detach(), even_columns=False)
        self.weight: torch.Tensor
        self.scales: torch.Tensor
        self.register_buffer("weight", q, persistent=False)
        self.register_buffer("scales", scales, persistent=False)
        self.bias = None if linear.bias is None else linear.bias.detach().to(ACTIVATIONS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if not 0 < rows <= INT8_STEP_ROWS:
            out: torch.Tensor = self.wide(x)
            return out
        flat = x.reshape(rows, self.in_features).to(ACTIVATIONS)
        product: torch.Tensor = torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scales)
        if self.bias is not None:
            product = product + self.bias
        return product.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"int8 for steps of up to {INT8_STEP_ROWS} rows"


class WidenedEmbedding(nn.Module):
    """An embedding table kept in its saved dtype, its rows widened to the compute dtype once
    looked up (Gemma's scale applied after, in the compute dtype, as the float32 model does).

    The table is a buffer, not a parameter: the model's ``dtype`` (its first parameter's) stays
    the compute dtype that the rest of transformers reads."""

    def __init__(self, embedding: nn.Embedding, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = embedding.num_embeddings, embedding.embedding_dim
        self.padding_idx = embedding.padding_idx
        self.weight: torch.Tensor
        self.register_buffer("weight", embedding.weight.detach(), persistent=False)
        self.scale = float(getattr(embedding, "scalar_embed_scale", 1.0))
        self.dtype = dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(input_ids, self.weight, self.padding_idx).to(self.dtype)
        return rows * self.scale if self.scale != 1.0 else rows


_KINDS: dict[Packing, type[Fp16Linear] | type[OnednnBf16Linear]] = {
    Packing.FBGEMM_FP16: Fp16Linear,
    Packing.ONEDNN_BF16: OnednnBf16Linear,
}


def pack_model(model: Any, precision: Precision) -> int:
    """Pack the text decoder's Linear layers and the output head of ``model`` (loaded on the
    CPU) for ``precision``, and bring every other weight but the embedding table to its dtype.
    Returns how many layers were packed."""
    if precision.packing is None:
        raise ValueError(f"{precision.name} packs nothing")
    wide = _KINDS[precision.packing]
    kind: Callable[[nn.Linear], nn.Module] = wide
    if precision.int8_blocks:
        kind = functools.partial(Int8StepLinear, wide=wide)
    inner = model.model
    text = getattr(inner, "language_model", inner)
    embedding = model.get_input_embeddings()
    read: list[torch.Tensor] = [embedding.weight]  # the head's weight, tied to it
    packed = 0
    with torch.no_grad():
        head = model.lm_head
        int8 = precision.int8_head and head.weight.numel() >= precision.int8_head_min
        if precision.int8_head and not int8:
            log.info(
                "the head stays %s: %.1fM weights, under the %dM an int8 head needs",
                precision.packing.value, head.weight.numel() / 2**20, precision.int8_head_min >> 20,
            )  # fmt: skip
        model.lm_head = Int8Head(head, precision.dtype) if int8 else wide(head)
        packed += 1
        for layer in getattr(text, "layers", ()):
            if fusable(layer):
                read += fuse_layer(layer, kind)
                packed += 7
        for parent in list(text.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    read.append(child.weight)
                    setattr(parent, name, kind(child))
                    packed += 1
        for parameter in model.parameters():
            if parameter.is_floating_point() and parameter is not embedding.weight:
                parameter.data = parameter.data.to(precision.dtype)
        if embedding.weight.dtype != precision.dtype:
            model.set_input_embeddings(WidenedEmbedding(embedding, precision.dtype))
    page_out(read)
    del read
    _trim_heap()
    return packed


def _trim_heap() -> None:
    """Return the heap's free pages to the kernel: packing made and freed a float32 or
    concatenated copy of each weight, and glibc keeps freed blocks below its mmap threshold."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # not glibc
            ctypes.CDLL(None).malloc_trim(0)


def page_out(tensors: Iterable[torch.Tensor]) -> None:
    """Hand the pages of ``tensors`` back to the kernel: pages of a mapped file are dropped (and
    read again if touched), others are left as they are. Never changes a value."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = mmap.PAGESIZE
    for tensor in tensors:
        storage = tensor.untyped_storage()
        start = -(-storage.data_ptr() // page) * page  # whole pages inside the storage only
        end = (storage.data_ptr() + storage.nbytes()) // page * page
        if end > start and libc.madvise(start, end - start, _MADV_PAGEOUT) != 0:
            log.debug("madvise(MADV_PAGEOUT) failed: errno %d", ctypes.get_errno())
            return
