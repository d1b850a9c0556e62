"""A session's conversation: its system prompt and finished exchanges, rendered into token ids by
the engine's prompt format (``engine/formats.py``: how each format lays out turns)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .formats import Exchange, PromptFormat, UserTurn


class Conversation:
    def __init__(self, prompt_format: PromptFormat) -> None:
        self.format = prompt_format
        self.system: str | None = None
        self._system_ids: list[int] = []
        self.exchanges: list[Exchange] = []

    def set_system(self, text: str | None, ids: Sequence[int] | None = None) -> None:
        """A new system prompt (``ids``: its tokens, ``tokenize_system``'s, when the caller
        already has them) starts the conversation afresh (PROTOCOL.md "configure")."""
        self.system = text or None
        if not text:
            self._system_ids = []
        else:
            self._system_ids = list(ids) if ids is not None else self.tokenize_system(text)
        self.exchanges.clear()

    def clear(self) -> None:
        self.exchanges.clear()

    @property
    def images(self) -> list[Any]:
        return [image for exchange in self.exchanges for image in exchange.images]

    @property
    def generated_tokens(self) -> int:
        """The replies' tokens, the ones that ended them left out (the dashboard's count)."""
        ends = self.format.end_ids
        total = 0
        for exchange in self.exchanges:
            reply = exchange.reply_ids
            total += len(reply) - (1 if reply and reply[-1] in ends else 0)
        return total

    def tokenize_user(self, text: str) -> list[int]:
        return self.format.tokenize_user(text)

    def tokenize_system(self, text: str) -> list[int]:
        return self.format.tokenize_system(text)

    def prompt_ids(
        self,
        user_ids: Sequence[int],
        image_ids: Sequence[Sequence[int]] = (),
        *,
        fresh: bool = False,
    ) -> list[int]:
        """The whole conversation plus a new user turn, ending where the model's reply begins;
        ``fresh``: as it would be after a reset (the system prompt and this turn alone)."""
        history = [] if fresh else self.exchanges
        user = UserTurn(list(user_ids), image_ids)
        return self.format.render(self._system_ids or None, history, user)

    def first_turn_tokens(self, system_ids: Sequence[int]) -> int:
        """The tokens of a first turn with this system prompt and no text: markup included."""
        return len(self.format.render(list(system_ids) or None, [], UserTurn([])))

    def add_exchange(
        self,
        user_ids: list[int],
        image_ids: Sequence[Sequence[int]],
        images: list[Any],
        reply_ids: Sequence[int],
    ) -> None:
        """Record a finished (or cancelled) exchange exactly as it was prompted and generated."""
        runs = [list(run) for run in image_ids]
        self.exchanges.append(Exchange(list(user_ids), runs, images, list(reply_ids)))
