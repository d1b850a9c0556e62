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
fp16-int8head  as fp16-weights, the head in int8           float32 (the head's        x86 CPUs
               (``int8head.py``)                           input: bfloat16)
bf16-int8head  as bf16-packed, the head in int8            bfloat16                   CPUs with
                                                                                      AVX512-BF16
fp16-int8      as fp16-int8head, and an int8 copy of each  as fp16-int8head (the      x86 CPUs
               decoder Linear for steps of one or two      int8 copies' input:
               rows (``packed.Int8StepLinear``)            bfloat16)
bf16-int8      as bf16-int8head, and an int8 copy of each  bfloat16                   CPUs with
               decoder Linear for steps of one or two                                 AVX512-BF16
               rows
=============  ==========================================  =========================  ==========

A decode step reads every weight once for a handful of rows, so on a CPU its time is the bytes
of the weights over the memory bandwidth: two-byte weights in a layout the kernel streams
without reshuffling are what make it fast. ``auto`` on a CPU, by its class (``host_class``):

- AMX (bf16 matrix units): ``bf16-int8``. oneDNN's kernels read the pre-reordered weight
  as fast as fbgemm's fp16 one for a single row, and its matrix units run the many rows of a
  batch or a prefill several times faster than fbgemm, which widens every fp16 value to
  float32 before it multiplies; a step of one or two rows reads the int8 copies instead;
- AVX512 without AMX: ``fp16-int8``, float32 arithmetic on half the bytes, far faster than
  plain bf16 where the CPU has no bf16 matrix units; a step of one or two rows reads the int8
  copies instead;
- AVX2: ``fp16-int8head``, the same without the int8 copies, whose kernel gains little over
  fbgemm's there (``python -m bench --only classes``);
- elsewhere: ``float32``.

On x86 the head is in int8 (half the bytes of the largest weight, compiled when the engine
starts: ``int8head.py``). The decoder's int8 copies cost half the bytes of its Linear weights
again (``--dtype bf16-int8head`` or ``fp16-int8head`` go without them).

On CUDA ``auto`` is bf16 (fp16 where the GPU lacks bf16). ``python -m bench`` compares the
choices on the host it runs on. Packing is ``packed.py``.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

import torch

AUTO = "auto"
AMX, AVX512, AVX2, OTHER = "amx", "avx512", "avx2", "other"  # host_class's answers
# auto puts a head of fewer weights in the Linear layers' packing: a few MB read a step gain
# little, and its compile costs a minute of a first start (the embedded model's has 168M)
INT8_HEAD_MIN = 32 * 2**20


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
    int8_head: bool = False  # the output head in int8 (int8head.py), the rest as ``packing``
    int8_head_min: int = 0  # ... if it has at least this many weights (auto: INT8_HEAD_MIN)
    int8_blocks: bool = False  # the decoder's Linears keep an int8 copy for narrow steps


PLAIN = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
PACKED = {  # name: (compute dtype, the Linear layers' packing, the head in int8, int8 blocks)
    "fp16-weights": (torch.float32, Packing.FBGEMM_FP16, False, False),
    "bf16-packed": (torch.bfloat16, Packing.ONEDNN_BF16, False, False),
    "fp16-int8head": (torch.float32, Packing.FBGEMM_FP16, True, False),
    "bf16-int8head": (torch.bfloat16, Packing.ONEDNN_BF16, True, False),
    "fp16-int8": (torch.float32, Packing.FBGEMM_FP16, True, True),
    "bf16-int8": (torch.bfloat16, Packing.ONEDNN_BF16, True, True),
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
    why_not = packing_unavailable(PACKED[name][1], device)
    if why_not:
        raise ValueError(f"--dtype {name} cannot run here: {why_not}")
    return _packed(name, "asked for with --dtype")


def _packed(name: str, reason: str, int8_head_min: int = 0) -> Precision:
    """The packed precision ``name`` as PACKED holds it."""
    dtype, packing, int8_head, int8_blocks = PACKED[name]
    return Precision(name, dtype, packing, reason, int8_head, int8_head_min, int8_blocks)


def _auto(device: str) -> Precision:
    if device.startswith("cuda"):
        if torch.cuda.is_bf16_supported():
            return Precision("bfloat16", torch.bfloat16, reason="auto: a GPU with bf16")
        return Precision("float16", torch.float16, reason="auto: a GPU without bf16")
    if device != "cpu":
        return Precision("float32", torch.float32, reason=f"auto: float32 on {device}")
    host = host_class()
    if host == AMX and not packing_unavailable(Packing.ONEDNN_BF16, device):
        return _packed(
            "bf16-int8",
            "auto: the CPU has AMX bf16 units; Linear weights in bf16, reordered once for "
            f"oneDNN's kernels, with an int8 copy for steps of one or two rows; "
            f"{_INT8_HEAD_REASON}",
            INT8_HEAD_MIN,
        )
    if host in (AMX, AVX512, AVX2) and not packing_unavailable(Packing.FBGEMM_FP16, device):
        # AVX2's int8 kernel gains too little over fbgemm's fp16 one to pay for the copies
        copies = host != AVX2
        return _packed(
            "fp16-int8" if copies else "fp16-int8head",
            f"auto: a CPU of the {host} class, no AMX in use; Linear weights in float16 packed "
            "once for fbgemm, float32 arithmetic"
            + (", with an int8 copy for steps of one or two rows" if copies else "")
            + f"; {_INT8_HEAD_REASON}",
            INT8_HEAD_MIN,
        )
    return Precision("float32", torch.float32, reason="auto: no packed kernels on this CPU")


_INT8_HEAD_REASON = (
    "the output head in int8 through a compiled kernel (half its bytes) if it has 32M weights "
    "or more"
)


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


def host_class() -> str:
    """The CPU's class as its kernels may use it: ATen's vector width (``ATEN_CPU_CAPABILITY``
    caps it) and AMX (``ONEDNN_MAX_CPU_ISA`` caps it), so one host stands for the others."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability == "AVX512":
        return AMX if cpu_has_amx() else AVX512
    return AVX2 if capability == "AVX2" else OTHER


def cpu_has_amx() -> bool:
    """The CPU's AMX units, unless oneDNN is capped below them (``ONEDNN_MAX_CPU_ISA``)."""
    check = getattr(torch.cpu, "_is_amx_tile_supported", None)
    if not (check and check()):
        return False
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL"
    return cap.upper() in ("ALL", "DEFAULT") or "AMX" in cap.upper()
