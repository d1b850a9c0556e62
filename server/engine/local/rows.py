"""``BatchRow``: one generation's state while it takes part in the batched engine's passes.

A row streams its tokens through its own ``TokenStreamer`` (stop strings, UTF-8-safe text) and
``LoopBridge``, picks tokens with its own ``RowSampler``, and on finishing hands its KV state to
the ``KVStore`` before its ``Finished`` (so the session's next prompt finds it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from wschat.protocol import FinishReason

from ..base import Finished, Generation, GenerationRequest, LoopBridge
from .kvstore import CachedPrefix, KVStore
from .sampling import RowSampler
from .slotkv import KVState
from .streamer import TokenStreamer


@dataclass(eq=False)
class BatchRow:
    request: GenerationRequest
    generation: Generation
    bridge: LoopBridge
    streamer: TokenStreamer
    sampler: RowSampler
    prefix: CachedPrefix | None
    max_new_tokens: int
    end_ids: frozenset[int]
    fed: int = 0  # prompt tokens whose KV state the row holds
    next_token: int = 0  # the last token picked: the input of the next decode pass
    finished: bool = field(default=False, init=False)
    error: BaseException | None = field(default=None, init=False)  # why it ends, if it failed

    def __post_init__(self) -> None:
        self.fed = len(self.prefix.ids) if self.prefix else 0
        self.streamer.put(torch.tensor(self.request.prompt_ids))  # its first put is the prompt

    @property
    def prompt_ids(self) -> list[int]:
        return self.request.prompt_ids

    @property
    def unfed(self) -> int:
        return len(self.request.prompt_ids) - self.fed

    @property
    def cancelled(self) -> bool:
        return self.generation.cancel_flag.is_set()

    @property
    def prefix_state(self) -> KVState | None:
        return self.prefix.cache if self.prefix else None

    def take(self, token: int) -> FinishReason | None:
        """Stream a picked token; the reason the row ends with it, if it does."""
        self.next_token = token
        self.sampler.observe(token)
        self.streamer.put(torch.tensor([token]))
        if token in self.end_ids or self.streamer.stop_string_hit:
            return FinishReason.STOP
        if len(self.streamer.generated) >= self.max_new_tokens:
            return FinishReason.LENGTH
        return None

    def finish(
        self,
        reason: FinishReason,
        state: KVState | None,
        store: KVStore,
        error: BaseException | None = None,
    ) -> None:
        """Deliver the terminal item (once), keeping ``state`` for the session's next turn."""
        if self.finished:
            return
        self.finished = True
        try:
            self.streamer.end()
            key = self.request.session_key
            if key and state is not None and state.length and reason is not FinishReason.ERROR:
                ids = [*self.request.prompt_ids, *self.streamer.generated][: state.length]
                store.put(key, CachedPrefix(state, ids, state.nbytes))
        finally:
            self.bridge.put(Finished(reason, tuple(self.streamer.generated), error))
