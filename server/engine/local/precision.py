"""How a model's numbers are held (``--dtype``), and what ``auto`` picks for the device.

=============  ==========================================  =========================  ==========
``--dtype``    Linear weights (the output head included)   activations, norms, KV     where
=============  ==========================================  =========================  ==========
float32        float32                                     float32                    anywhere
bfloat16       bfloat16                                    bfloat16                   GPUs, CPUs
float16        float16                                     float16                    GPUs
fp16-weights   float16, packed once for fbgemm             float32                    x86 CPUs
bf16-packed    bfloat16, reordered once for oneDNN         bfloat16                   CPUs with
                                                                                      AVX512-BF16
=============  ==========================================  =========================  ==========

A decode step reads every weight once for a handful of rows, so on a CPU its time is the bytes
of the weights over the memory bandwidth: two-byte weights in a layout the kernel streams
without reshuffling are what make it fast. ``auto`` on a CPU:

- with AMX (bf16 matrix units): ``bf16-packed``. oneDNN's kernels read the pre-reordered weight
  as fast as fbgemm's fp16 one for a single row, and its matrix units run the many rows of a
  batch or a prefill several times faster than fbgemm, which widens every fp16 value to float32
  before it multiplies;
- other x86 CPUs (fbgemm is there), AVX512-BF16 ones without AMX included: ``fp16-weights``,
  float32 arithmetic on half the bytes, far faster than plain bf16 where the CPU has no bf16
  matrix units;
- elsewhere: ``float32``.

On CUDA ``auto`` is bf16 (fp16 where the GPU lacks bf16). ``python -m bench`` compares the
choices on the host it runs on. Packing is ``packed.py``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

AUTO = "auto"


class Packing(enum.Enum):
    """How the weights of the Linear layers are laid out for their kernel."""

    FBGEMM_FP16 = "fbgemm-fp16"  # torch.ops.quantized.linear_prepack_fp16 / linear_dynamic_fp16
    ONEDNN_BF16 = "onednn-bf16"  # torch.ops.mkldnn._reorder_linear_weight / _linear_pointwise


@dataclass(frozen=True, slots=True)
class Precision:
    name: str  # as --dtype names it (and /readyz, /metrics and the start-up log show it)
    dtype: torch.dtype  # of the activations, norms and KV cache
    packing: Packing | None = None
    reason: str = ""  # why this one: for the start-up log


PLAIN = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
PACKED = {
    "fp16-weights": (torch.float32, Packing.FBGEMM_FP16),
    "bf16-packed": (torch.bfloat16, Packing.ONEDNN_BF16),
}
# What --dtype accepts (settings.DTYPES repeats it without importing torch; a test checks both).
CHOICES = (AUTO, *PLAIN, *PACKED, *ALIASES)


def pick_precision(requested: str, device: str) -> Precision:
    """The precision ``--dtype`` names, or ``auto``'s pick for ``device``; ValueError when the
    name is unknown or this device cannot run it (with the reason)."""
    name = ALIASES.get(requested, requested)
    if name == AUTO:
        return _auto(device)
    if name in PLAIN:
        return Precision(name, PLAIN[name], reason="asked for with --dtype")
    if name not in PACKED:
        raise ValueError(f"unknown dtype {requested!r}; use one of {', '.join(CHOICES)}")
    dtype, packing = PACKED[name]
    why_not = packing_unavailable(packing, device)
    if why_not:
        raise ValueError(f"--dtype {name} cannot run here: {why_not}")
    return Precision(name, dtype, packing, "asked for with --dtype")


def _auto(device: str) -> Precision:
    if device.startswith("cuda"):
        if torch.cuda.is_bf16_supported():
            return Precision("bfloat16", torch.bfloat16, reason="auto: a GPU with bf16")
        return Precision("float16", torch.float16, reason="auto: a GPU without bf16")
    if device != "cpu":
        return Precision("float32", torch.float32, reason=f"auto: float32 on {device}")
    if cpu_has_amx() and not packing_unavailable(Packing.ONEDNN_BF16, device):
        return Precision(
            "bf16-packed",
            torch.bfloat16,
            Packing.ONEDNN_BF16,
            "auto: the CPU has AMX bf16 units; Linear weights in bf16, reordered once for "
            "oneDNN's kernels",
        )
    if not packing_unavailable(Packing.FBGEMM_FP16, device):
        return Precision(
            "fp16-weights",
            torch.float32,
            Packing.FBGEMM_FP16,
            "auto: an x86 CPU without AMX; Linear weights in float16 packed once for fbgemm, "
            "float32 arithmetic",
        )
    return Precision("float32", torch.float32, reason="auto: no packed kernels on this CPU")


def packing_unavailable(packing: Packing, device: str) -> str | None:
    """Why ``packing`` cannot run on ``device``, or None when it can."""
    if device != "cpu":
        return f"packed weights run on the CPU only, not on {device}"
    if packing is Packing.FBGEMM_FP16:
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            return "this torch build has no fbgemm (x86 CPUs only)"
        return None
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return "this torch build has no oneDNN"
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "the CPU lacks the instructions oneDNN's bf16 kernels need (AVX512 or AMX)"
    return None


def cpu_has_amx() -> bool:
    check = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(check and check())
