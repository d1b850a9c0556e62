"""transformers' own continuous batching manager (``model.init_continuous_batching()``), in process.

Measured beside the static-batch ceiling because it was the first candidate for the server's
batched engine (issue 5); its figures land in the same table.
"""

from __future__ import annotations

import time
from typing import Any

from .stats import StreamTimes


def continuous_batching(
    model: Any, prompts: list[list[int]], max_new_tokens: int, eos: list[int], pad_id: int
) -> list[StreamTimes]:
    """All ``prompts`` added at once to a fresh manager, greedy; per-token timestamps."""
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=pad_id,
    )
    manager = model.init_continuous_batching(generation_config=config)
    manager.start()
    try:
        # A first request pays for the manager's cache set-up: a server would pay it once.
        warm = manager.add_request(prompts[0][:8], max_new_tokens=2)
        while (
            out := manager.get_result(request_id=warm, timeout=60)
        ) is None or not out.is_finished():
            pass
        sent = time.perf_counter()
        ids = [
            manager.add_request(p, max_new_tokens=max_new_tokens, record_timestamps=True)
            for p in prompts
        ]
        results: dict[str, Any] = {}
        deadline = time.monotonic() + 300
        while len(results) < len(ids) and time.monotonic() < deadline:
            out = manager.get_result(timeout=1)
            if out is not None and out.is_finished():
                results[out.request_id] = out
    finally:
        manager.stop(block=True)
    if len(results) < len(ids):
        raise RuntimeError(f"continuous batching finished {len(results)} of {len(ids)} requests")
    return [StreamTimes(sent, list(results[i].timestamps or [])) for i in ids]
