"""The worker-thread side of streaming: incremental decoding, stop strings, cancel and stop checks.

``TokenStreamer`` is what ``model.generate(streamer=...)`` calls once per step. It decodes each
token with tokenizers' ``DecodeStream`` (no re-decoding of the whole reply, and never half a UTF-8
character), emits text at once instead of waiting for a space, and holds back only the tail that
could still grow into a stop string or a turn label (``stopping.StopTexts``). Tokens that end the
reply in the prompt format (``end_ids``: ``<end_of_turn>``, ``<eos>``) are kept in ``generated``
but never become text. A reply that asked for logprobs has a ``LogprobRecorder``: each token's
entry travels with its id (``TokenPiece.logprobs``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from tokenizers.decoders import DecodeStream
from transformers import StoppingCriteria

from ..base import CancelFlag, Logprob, TokenPiece
from ..stopping import StopTexts
from .logprobs import LogprobRecorder


class TokenStreamer:
    """A reply's streamer: ``generate`` calls ``put`` (the prompt first, then one token a
    step), the batched engine ``push`` (one picked token, an int)."""

    def __init__(
        self,
        backend_tokenizer: Any,
        emit: Callable[[TokenPiece], None],
        stops: Sequence[str] = (),
        *,
        end_ids: frozenset[int] = frozenset(),
        labels: Sequence[str] = (),
        strip_leading_space: bool = False,
        recorder: LogprobRecorder | None = None,
    ) -> None:
        self._tokenizer = backend_tokenizer
        self._end_ids = end_ids
        # "Assistant: Paris": the reply's first token carries the space after the label.
        self._strip_space = strip_leading_space
        self._emit = emit
        self._decoder = DecodeStream(skip_special_tokens=True)
        self._stops = StopTexts(stops, labels)
        self._seen_prompt = False
        self._ids: list[int] = []  # ids whose text is not emitted yet
        self._logprobs: list[Logprob] = []  # theirs, when the reply asked
        self.recorder = recorder
        self.generated: list[int] = []

    @property
    def stop_string_hit(self) -> bool:
        return self._stops.hit

    def put(self, value: torch.Tensor) -> None:
        """``generate``'s call: the prompt first, then each step's token."""
        if not self._seen_prompt:
            self._seen_prompt = True
            return
        for token_id in value.reshape(-1).tolist():
            self.push(int(token_id))

    def push(self, token_id: int) -> None:
        """One picked token (the batched engine's, which never hands over the prompt)."""
        self.generated.append(token_id)
        if self._stops.hit:
            return  # generation stops at this step; nothing after the stop string is text
        self._ids.append(token_id)
        if self.recorder is not None:
            self._logprobs.append(self.recorder.take(token_id))
        if token_id in self._end_ids:
            return  # the turn's end: its id travels with the reply's last text, never as text
        piece = self._decoder.step(self._tokenizer, token_id)
        if piece and self._strip_space:
            self._strip_space = False
            piece = piece.removeprefix(" ")
        text = self._stops.feed(piece) if piece else ""
        if text:
            self._send(text)

    def _send(self, text: str) -> None:
        ids, self._ids = tuple(self._ids), []
        logprobs, self._logprobs = tuple(self._logprobs), []
        self._emit(TokenPiece(text, ids, logprobs))

    def end(self) -> None:
        tail = self._stops.flush()
        if tail or self._ids:
            self._send(tail)


class StopWhen(StoppingCriteria):
    """Ends generation at the next step boundary when ``should_stop()`` turns true."""

    def __init__(self, should_stop: Callable[[], bool]) -> None:
        self._should_stop = should_stop

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> Any:
        stop = self._should_stop()
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


def cancel_or_stop(flag: CancelFlag, streamer: TokenStreamer) -> StopWhen:
    return StopWhen(lambda: flag.is_set() or streamer.stop_string_hit)
