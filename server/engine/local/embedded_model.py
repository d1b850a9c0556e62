"""The embedded Gemma 3 270M as a transformers folder: its GGUF (``engine/embedded.py``)
dequantized and saved once per cache folder, under a lock, on first use (about a minute), then
read from there by the loader, the dev models' tokenizer and the bench.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import torch

from ..embedded import cache_lock, default_cache_dir, embedded_gguf
from .ticker import Ticker

log = logging.getLogger("wschat.loader")

EMBEDDED_NAME = "gemma-3-270m (embedded, from GGUF Q4_K_M)"
_CONVERTED_MARKER = "wschat-converted.json"


def embedded_model_dir(cache_dir: Path | None = None) -> Path:
    """The converted embedded model folder, converting the GGUF on first use."""
    target = (cache_dir or default_cache_dir()) / "gemma-3-270m"
    if (target / _CONVERTED_MARKER).exists():
        return target
    with cache_lock(target.with_name(target.name + ".lock")):  # one converts, others wait
        if not (target / _CONVERTED_MARKER).exists():
            _convert_embedded(target)
    return target


def _convert_embedded(target: Path) -> None:
    log.info("first start: converting the embedded Gemma 3 270M GGUF (about a minute)...")
    with Ticker(log, "assembling the GGUF") as ticker:  # no step is silent for 10 s
        _convert_steps(target, ticker)


def _convert_steps(target: Path, ticker: Ticker) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    started = ticker.started  # one clock for the step lines and the ticks
    # kept once converted: llama.cpp's server and the gateway's tokenizer read it too
    gguf = embedded_gguf(target.parent)
    log.info("  [1/3] GGUF assembled and verified: %s", gguf)
    ticker.step = "reading the tokenizer"
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    log.info("  [2/3] tokenizer read (%.0f s)", time.perf_counter() - started)
    ticker.step = "dequantizing the weights"
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(dequantize=True),
    )
    model.generation_config.eos_token_id = [1, tokenizer.convert_tokens_to_ids("<end_of_turn>")]
    log.info("  [3/3] weights dequantized (%.0f s)", time.perf_counter() - started)
    ticker.step = "saving the converted model"
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    (partial / _CONVERTED_MARKER).write_text(f'{{"source": "{gguf.name}"}}\n')
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)  # atomic: a crash mid-save never leaves a half folder in place
    log.info("converted and cached in %s (%.0f s)", target, time.perf_counter() - started)
