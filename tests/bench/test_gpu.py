"""bench/gpu.py: the 12B shape it builds, and its whole path (model, ceiling, a wschat server
process, the WebSocket load, the table) run on the CPU with the tiny model of the same kind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Gemma3ForCausalLM

from bench import gpu

ROOT = Path(__file__).resolve().parents[2]
# Gemma 3 12B text-only: 11,765,788,416 parameters with its 262,144-token vocabulary
# (keras-hub's preset); transformers' config pads the vocabulary to 262,208 rows.
GEMMA3_12B_PARAMETERS = 11_765_788_416 + (262_208 - 262_144) * 3840


def test_the_12b_shape_has_gemma_3_12b_parameter_count() -> None:
    with torch.device("meta"):
        model = Gemma3ForCausalLM._from_config(gpu.text_config(gpu.GEMMA3_12B))
    assert sum(p.numel() for p in model.parameters()) == GEMMA3_12B_PARAMETERS
    assert gpu.weight_bytes(model.to(torch.bfloat16)) == 2 * GEMMA3_12B_PARAMETERS


def test_every_sixth_layer_attends_to_the_whole_context() -> None:
    kinds = gpu.layer_types(48)
    assert [i for i, kind in enumerate(kinds) if kind == "full_attention"] == list(range(5, 48, 6))


def test_a_stream_that_ends_early_marks_the_measurement_incomplete() -> None:
    from bench.stats import StreamTimes

    streams = [StreamTimes(0.0, [0.1, 0.2, 0.3]), StreamTimes(0.0, [0.1, 0.2])]
    assert gpu.figures(streams, 3)["complete"] is False
    assert gpu.figures(streams[:1], 3)["complete"] is True


@pytest.mark.real_model  # the embedded model's tokenizer
def test_the_whole_run_on_the_cpu_measures_both_systems(tmp_path: Path) -> None:
    from wschat.server.engine.local.embedded_model import embedded_model_dir

    out = tmp_path / "gpu.json"
    command = [
        sys.executable, "-m", "bench.gpu", "--tiny",
        "--tokenizer", str(embedded_model_dir()),
        "--tokens", "8", "--sessions", "1,2", "--rounds", "1",
        "--logs", str(tmp_path / "logs"), "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["error"] is None
    assert result["weight_bound_tps"] > 0
    for system in ("ceiling", "wschat"):
        assert set(result[system]) == {"1", "2"}
        for row in result[system].values():
            assert row["complete"], row  # every stream ran to its 8 tokens
            assert row["aggregate_tps"] > 0
    assert "ceiling tok/s" in done.stdout
