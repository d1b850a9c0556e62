"""``BatchRow``: one generation's state while it takes part in the batched engine's passes.

A row is where its three handlers meet: the scheduler moves it through its ``RowState`` and
counts the prompt it has fed, the model runner picks its tokens with its own ``RowSampler`` and
keeps its KV state in a slot, and the output processor streams what it picks through its own
``TokenStreamer`` (stop strings, UTF-8-safe text) and ``LoopBridge``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..base import Generation, GenerationRequest, LoopBridge
from ..grammar import GrammarMatcher
from .kvstore import CachedPrefix, RingMark, carried_marks
from .logprobs import LogprobRecorder
from .sampling import RowSampler
from .scheduler import RowState
from .sequence_kv import KVState
from .siblings import SiblingKey
from .streamer import TokenStreamer


@dataclass(eq=False)
class BatchRow:
    request: GenerationRequest
    generation: Generation
    bridge: LoopBridge
    streamer: TokenStreamer
    sampler: RowSampler
    prefix: CachedPrefix | None
    max_new_tokens: int  # its budget (``stopping.token_budget``)
    end_ids: frozenset[int]
    fed: int = 0  # prompt tokens whose KV state the row holds
    # the prompt's opening to keep for other sessions once it is fed (0: none, or kept)
    opening: int = 0
    # its response format's place (None: unconstrained): masks its picks, takes each one
    grammar: GrammarMatcher | None = None
    # siblings.py: the rows waiting for this one's prefill, and what it leads them under; a
    # row that starts from a sibling's: the logits its first token is picked from
    followers: list[BatchRow] = field(default_factory=list, init=False)
    sibling_key: SiblingKey | None = field(default=None, init=False)
    first_logits: torch.Tensor | None = field(default=None, init=False)
    # the scheduler's up to DECODING; FINISHED the output's, once its terminal item is delivered
    state: RowState = field(default=RowState.WAITING, init=False)

    def __post_init__(self) -> None:
        self.fed = len(self.prefix.ids) if self.prefix else 0

    def take_first_logits(self) -> torch.Tensor:
        """The logits its first token is picked from (its sibling's), handed over once."""
        logits, self.first_logits = self.first_logits, None
        assert logits is not None, "only a row admitted with its sibling's logits picks first"
        return logits

    @property
    def logprobs(self) -> LogprobRecorder | None:
        return self.streamer.recorder

    @property
    def prompt_ids(self) -> list[int]:
        return self.request.prompt_ids

    @property
    def last_token(self) -> int:
        """The token it picked last (``streamer.generated``, which every pick goes through)."""
        return self.streamer.generated[-1]

    @property
    def unfed(self) -> int:
        return len(self.request.prompt_ids) - self.fed

    @property
    def cancelled(self) -> bool:
        return self.generation.cancel_flag.is_set()

    @property
    def prefix_state(self) -> KVState | None:
        return self.prefix.cache if self.prefix else None

    @property
    def own_prefix_state(self) -> KVState | None:
        """The state it started from where that is the session's own, not a shared opening."""
        return None if self.prefix is None or self.prefix.shared else self.prefix.cache

    def marks(self) -> tuple[RingMark, ...]:
        """The ring marks of the state this row leaves: its prefix's and the prefix's own
        rings, which the batch copied in and never wrote (``kvstore.carried_marks``); none
        from a shared opening, whose tensors stay the store's (the store serves a cut back to
        it from the opening itself)."""
        state = self.own_prefix_state
        return carried_marks(self.prefix, None if state is None else state.mark())
