"""A reply's logprobs (``SamplingParams.logprobs``): each step's distribution read from the
logits as the model gave them, before the repetition penalty, the temperature, the filters and a
response format's mask change them (PROTOCOL.md "params": the model's distribution, as OpenAI
and vLLM report it), then the token picked looked up in it.

A row that asked for none has no recorder and costs nothing; the rows that asked share one
``log_softmax`` and one search for the most probable a step (``observe``; ``largest``, from
block maxima: ``topk`` over the vocabulary cost three times the ``log_softmax``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..base import Logprob, TokenChoice
from ..token_bytes import TokenTexts
from .sampling import largest

# The least logprob reported (OpenAI's floor): a token the model all but rules out
FLOOR = -9999.0


class LogprobRecorder:
    """One reply's: ``observe`` each step's logits (or ``observe`` of a batch sets it), then
    ``take`` the token the step picked."""

    def __init__(self, top: int, texts: TokenTexts) -> None:
        self.top = top
        self._texts = texts
        self._row: torch.Tensor | None = None  # the step's log-probabilities, [vocab]
        self._best: list[tuple[int, float]] = []  # its ``top`` most probable, most first

    def hold(self, row: torch.Tensor, best: list[tuple[int, float]]) -> None:
        """The step's log-probabilities ``[vocab]`` and its most probable tokens."""
        self._row, self._best = row, best

    def take(self, token_id: int) -> Logprob:
        """The picked token's entry; a step not observed is an error of ours."""
        if self._row is None:
            raise RuntimeError("a token was taken before its step was observed")
        chosen = self._choice(token_id, float(self._row[token_id]))
        self._row = None
        return Logprob(chosen, tuple(self._choice(i, v) for i, v in self._best))

    def _choice(self, token_id: int, logprob: float) -> TokenChoice:
        text, data = self._texts.of(token_id)
        return TokenChoice(token_id, text, data, max(logprob, FLOOR))


def observe(recorders: Sequence[LogprobRecorder], logits: torch.Tensor) -> None:
    """Each recorder's step from its row of ``logits`` ``[len(recorders), vocab]`` (float32,
    untouched yet)."""
    rows = torch.log_softmax(logits, dim=-1)
    k = max(recorder.top for recorder in recorders)
    values, ids = largest(rows, k) if k else (None, None)
    for j, recorder in enumerate(recorders):
        best: list[tuple[int, float]] = []
        if values is not None and ids is not None and recorder.top:
            n = recorder.top
            top_ids, top_values = ids[j, :n].tolist(), values[j, :n].tolist()
            best = [(int(i), float(v)) for i, v in zip(top_ids, top_values, strict=True)]
        recorder.hold(rows[j], best)
