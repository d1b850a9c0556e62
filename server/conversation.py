"""A session's conversation and its rendering into Gemma 3's turn format, as token ids.

Rendering works on ids, never on a string of markup: user text is tokenized as text (control
tokens typed by a user stay text), and model turns keep the exact ids the model produced, so each
prompt extends the previous one token for token and its KV state can be reused.

    <bos><start_of_turn>user\\n{system}\\n\\n{text}<end_of_turn>\\n<start_of_turn>model\\n{reply}...
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .engine import Engine


@dataclass(slots=True)
class Turn:
    role: Literal["user", "model"]
    ids: list[int]
    images: list[Any] = field(default_factory=list)


class TurnMarkup:
    """The fixed token ids around turns, looked up once per engine."""

    def __init__(self, engine: Engine) -> None:
        self.bos = engine.token_id("<bos>")
        self.start = engine.token_id("<start_of_turn>")
        self.end = engine.token_id("<end_of_turn>")
        self.newline = engine.tokenize_text("\n")
        self.user = engine.tokenize_text("user\n")
        self.model = engine.tokenize_text("model\n")
        self.system_gap = engine.tokenize_text("\n\n")
        self.end_ids = set(engine.info.end_of_turn_ids)


class Conversation:
    def __init__(self, engine: Engine, markup: TurnMarkup | None = None) -> None:
        self._markup = markup or TurnMarkup(engine)
        self.system: str | None = None
        self._system_ids: list[int] = []
        self.turns: list[Turn] = []

    def set_system(self, text: str | None, ids: Sequence[int] = ()) -> None:
        """A new system prompt (``ids``: its tokens) starts the conversation afresh
        (PROTOCOL.md "configure")."""
        self.system = text or None
        self._system_ids = list(ids) if text else []
        self.turns.clear()

    def clear(self) -> None:
        self.turns.clear()

    @property
    def images(self) -> list[Any]:
        return [image for turn in self.turns for image in turn.images]

    def prompt_ids(
        self,
        user_ids: Sequence[int],
        image_ids: Sequence[Sequence[int]] = (),
        *,
        fresh: bool = False,
    ) -> list[int]:
        """The whole conversation plus a new user turn, ending where the model's reply begins;
        ``fresh``: as it would be after a reset (the system prompt and this turn alone)."""
        turns = [] if fresh else self.turns
        content = self._user_content(list(user_ids), image_ids, first=not turns)
        return self._prompt([*turns, Turn("user", content)])

    def first_turn_tokens(self, system_ids: Sequence[int]) -> int:
        """The tokens of a first turn with this system prompt and no text: markup included."""
        return len(self._prompt([Turn("user", self._system_part(system_ids))]))

    def add_exchange(
        self,
        user_ids: list[int],
        image_ids: Sequence[Sequence[int]],
        images: list[Any],
        reply_ids: Sequence[int],
    ) -> None:
        """Record a finished (or cancelled) exchange exactly as it was prompted."""
        first = not self.turns
        content = self._user_content(user_ids, image_ids, first)
        self.turns.append(Turn("user", content, images))
        reply = list(reply_ids)
        while reply and reply[-1] in self._markup.end_ids:
            reply.pop()
        self.turns.append(Turn("model", reply))

    def _user_content(
        self, user_ids: list[int], image_ids: Sequence[Sequence[int]], first: bool
    ) -> list[int]:
        content = self._system_part(self._system_ids) if first else []
        for placeholder in image_ids:
            content += list(placeholder)
        return content + user_ids

    def _system_part(self, system_ids: Sequence[int]) -> list[int]:
        return [*system_ids, *self._markup.system_gap] if system_ids else []

    def _prompt(self, turns: Sequence[Turn]) -> list[int]:
        m = self._markup
        ids = [m.bos]
        for turn in turns:
            ids += self._render(turn)
        return [*ids, m.start, *m.model]

    def _render(self, turn: Turn) -> list[int]:
        m = self._markup
        role = m.user if turn.role == "user" else m.model
        return [m.start, *role, *turn.ids, m.end, *m.newline]
