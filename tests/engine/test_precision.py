"""``pick_precision``: what each ``--dtype`` name means, what ``auto`` picks for the device and
the CPU, and the refusals (with their reasons) where a name cannot run."""

from __future__ import annotations

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


@pytest.mark.parametrize("name", ["fp16-weights", "bf16-packed"])
def test_packed_weights_are_refused_off_the_cpu(name: str) -> None:
    with pytest.raises(ValueError, match=rf"--dtype {name} cannot run here: .*CPU only"):
        pick_precision(name, "cuda")


def test_fp16_weights_compute_in_float32_with_fbgemm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "packing_unavailable", lambda packing, device: None)
    picked = pick_precision("fp16-weights", "cpu")
    assert (picked.dtype, picked.packing) == (torch.float32, Packing.FBGEMM_FP16)


def test_auto_on_a_cpu_with_amx_packs_bf16_for_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_has_amx", lambda: True)
    monkeypatch.setattr(precision, "packing_unavailable", lambda packing, device: None)
    picked = pick_precision("auto", "cpu")
    assert (picked.name, picked.dtype, picked.packing) == (
        "bf16-packed",
        torch.bfloat16,
        Packing.ONEDNN_BF16,
    )
    assert "AMX" in picked.reason


def test_auto_on_an_x86_cpu_without_amx_takes_fp16_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(precision, "cpu_has_amx", lambda: False)
    monkeypatch.setattr(precision, "packing_unavailable", lambda packing, device: None)
    picked = pick_precision("auto", "cpu")
    assert (picked.name, picked.packing) == ("fp16-weights", Packing.FBGEMM_FP16)
    assert picked.reason.startswith("auto:")


def test_auto_without_packed_kernels_is_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_has_amx", lambda: True)
    monkeypatch.setattr(precision, "packing_unavailable", lambda packing, device: "none here")
    assert pick_precision("auto", "cpu").name == "float32"


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
