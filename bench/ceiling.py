"""The in-process ceiling: ``model.generate`` on the same model and prompts, no server between.

Every token is timestamped the moment ``generate`` hands it to its streamer, so the ceiling's
TTFT and inter-token gaps are measured the way a client of the server measures them.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers.generation.streamers import BaseStreamer

from .stats import StreamTimes


class _Clock(BaseStreamer):
    """Timestamps of each step's tokens; the first ``put`` is the prompt."""

    def __init__(self, rows: int, pad_id: int) -> None:
        self.rows = rows
        self.pad_id = pad_id
        self.prompt_seen = False
        self.times: list[list[float]] = [[] for _ in range(rows)]
        self.finished = [False] * rows
        self.eos: set[int] = set()

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        now = time.perf_counter()
        for row, token in enumerate(value.reshape(self.rows).tolist()):
            if self.finished[row]:
                continue
            self.times[row].append(now)
            if token in self.eos:
                self.finished[row] = True

    def end(self) -> None:
        pass


def static_batch(
    model: Any, prompts: list[list[int]], max_new_tokens: int, eos: list[int], pad_id: int
) -> list[StreamTimes]:
    """One ``generate`` over all ``prompts`` (left-padded), greedy, each row to its own end."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, prompt in enumerate(prompts):
        ids[b, width - len(prompt) :] = torch.tensor(prompt)
        mask[b, width - len(prompt) :] = 1
    clock = _Clock(len(prompts), pad_id)
    clock.eos = set(eos)
    started = time.perf_counter()
    with torch.inference_mode():
        model.generate(
            input_ids=ids.to(model.device),
            attention_mask=mask.to(model.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            top_k=None,
            top_p=None,
            eos_token_id=eos,
            pad_token_id=pad_id,
            streamer=clock,
        )
    return [StreamTimes(started, times) for times in clock.times]
