"""``LocalEngineOptions``: what a local engine (``generate`` or ``batched``) is built with, in one
place. The runtime fills it from the settings (``runtime/engines.py``); the tests and the bench
build it as they need."""

from __future__ import annotations

from dataclasses import dataclass

from .kvstore import SHARED_OPENINGS
from .scheduler import GATHER_S


@dataclass(frozen=True, slots=True)
class LocalEngineOptions:
    context_tokens: int = 8192  # at most the model's own context
    max_images: int = 4  # per conversation (0 where the model reads none)
    kv_budget_bytes: int = 1 << 30  # the sessions' KV state kept between turns
    shared_openings: int = SHARED_OPENINGS  # prompt openings kept for every session
    prompt_format: str = "auto"  # formats.build_format's name
    # The batched engine's alone: its rows (None: the device's width that the memory holds,
    # ``batch_width.py``), the prompt tokens one prefill pass feeds, and its burst gathering
    width: int | None = 8
    prefill_tokens: int = 512
    gather_s: float = GATHER_S


DEFAULT_OPTIONS = LocalEngineOptions()
