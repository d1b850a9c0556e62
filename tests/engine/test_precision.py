"""``pick_precision``: what each ``--dtype`` name means, what ``auto`` picks for the device and
the CPU, and the refusals (with their reasons) where a name cannot run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from wschat.server.engine.local import precision
from wschat.server.engine.local.precision import Packing, pick_precision
from wschat.server.settings import DTYPES


def test_the_settings_accept_exactly_the_names_the_engine_knows() -> None:
    assert set(DTYPES) == set(precision.CHOICES)


@pytest.mark.parametrize(
    ("name", "dtype"),
    [("float32", torch.float32), ("fp32", torch.float32), ("bf16", torch.bfloat16)],
)
def test_plain_names_and_their_aliases_hold_every_weight_in_that_dtype(
    name: str, dtype: torch.dtype
) -> None:
    picked = pick_precision(name, "cpu")
    assert (picked.dtype, picked.packing) == (dtype, None)
    assert picked.name in precision.PLAIN


def test_an_unknown_name_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown dtype 'int3'.*fp16-weights"):
        pick_precision("int3", "cpu")


@pytest.mark.parametrize("name", list(precision.PACKED))
def test_packed_weights_are_refused_off_the_cpu(name: str) -> None:
    with pytest.raises(ValueError, match=rf"--dtype {name} cannot run here: .*CPU only"):
        pick_precision(name, "cuda")


def test_fp16_weights_compute_in_float32_with_fbgemm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "packing_unavailable", lambda packing, device: None)
    picked = pick_precision("fp16-weights", "cpu")
    assert (picked.dtype, picked.packing) == (torch.float32, Packing.FBGEMM_FP16)
    assert not picked.int8_head


@pytest.mark.parametrize(
    ("name", "dtype", "packing", "int8_blocks"),
    [
        ("fp16-int8head", torch.float32, Packing.FBGEMM_FP16, False),
        ("bf16-int8head", torch.bfloat16, Packing.ONEDNN_BF16, False),
        ("fp16-int8", torch.float32, Packing.FBGEMM_FP16, True),
        ("bf16-int8", torch.bfloat16, Packing.ONEDNN_BF16, True),
    ],
)
def test_an_int8_head_precision_packs_the_rest_as_its_kind(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    dtype: torch.dtype,
    packing: Packing,
    int8_blocks: bool,
) -> None:
    monkeypatch.setattr(precision, "packing_unavailable", lambda packing, device: None)
    picked = pick_precision(name, "cpu")
    assert (picked.dtype, picked.packing, picked.int8_head) == (dtype, packing, True)
    assert picked.int8_blocks == int8_blocks


@pytest.mark.parametrize(
    ("host", "name", "packing", "why"),
    [
        ("amx", "bf16-int8", Packing.ONEDNN_BF16, "the CPU has AMX bf16 units"),
        ("avx512", "fp16-int8", Packing.FBGEMM_FP16, "the avx512 class, no AMX"),
        ("avx2", "fp16-int8head", Packing.FBGEMM_FP16, "the avx2 class, no AMX"),
    ],
)
def test_auto_on_a_cpu_picks_by_its_class_and_says_why(
    monkeypatch: pytest.MonkeyPatch, host: str, name: str, packing: Packing, why: str
) -> None:
    monkeypatch.setattr(precision, "host_class", lambda: host)
    monkeypatch.setattr(precision, "packing_unavailable", lambda packing, device: None)
    picked = pick_precision("auto", "cpu")
    assert (picked.name, picked.packing, picked.int8_head) == (name, packing, True)
    assert picked.int8_blocks == name.endswith("-int8")
    copies = "int8 copy for steps of one or two rows" in picked.reason
    assert why in picked.reason and copies == picked.int8_blocks
    assert picked.int8_head_min == precision.INT8_HEAD_MIN
    assert picked.reason.startswith("auto:") and why in picked.reason
    assert "head in int8" in picked.reason


def test_auto_without_packed_kernels_is_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "host_class", lambda: "amx")
    monkeypatch.setattr(precision, "packing_unavailable", lambda packing, device: "none here")
    assert pick_precision("auto", "cpu").name == "float32"


@pytest.mark.parametrize(
    ("cap", "amx"),
    [(None, True), ("AVX512_CORE_BF16", False), ("avx2", False), ("AVX512_CORE_AMX", True)],
)
def test_a_onednn_cap_below_amx_makes_a_cpu_with_amx_one_without(
    monkeypatch: pytest.MonkeyPatch, cap: str | None, amx: bool
) -> None:
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if cap is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert precision.cpu_has_amx() is amx


@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"), reason="an x86 class"
)
def test_the_caps_make_this_host_an_avx2_one_in_a_new_process() -> None:
    env = os.environ | {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    code = "from wschat.server.engine.local import precision as p; print(p.host_class())"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout.strip()) == (0, "avx2"), done.stderr


def test_a_packing_this_cpu_cannot_run_is_refused_with_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(precision, "packing_unavailable", lambda packing, device: "no fbgemm")
    with pytest.raises(ValueError, match="--dtype fp16-weights cannot run here: no fbgemm"):
        pick_precision("fp16-weights", "cpu")


def test_auto_on_this_machine_names_a_precision_its_cpu_runs() -> None:
    picked = pick_precision("auto", "cpu")
    if picked.packing is not None:
        assert precision.packing_unavailable(picked.packing, "cpu") is None
    assert picked.reason.startswith("auto:")
