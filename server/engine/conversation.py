"""``Conversation``: a session's system prompt and finished exchanges as exact token ids per turn,
rendered with the engine's prompt format (``formats.py``: how each format lays out turns), so each
prompt extends the last one token for token; its export as plain data and its checked import
(``IdBudget``). No torch here: an engine that only has a ``tokenizers`` tokenizer renders the same
prompts.

An exchange is a user turn, the replies that called tools with their results (``ToolRound``),
and the last reply (exchanges.py); a last reply that called tools holds its calls until their
results come (``pending_calls``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import Message
from .exchanges import Exchange, ToolRound, UserTurn, without_end
from .formats import PromptFormat
from .tools import FunctionCall

MAX_TOKEN_ID = 1 << 31  # an id no engine takes (int32): the bound when the vocabulary is unknown


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

    def images_of(self, count: int) -> list[Any]:
        """The images of its first ``count`` exchanges."""
        return [image for exchange in self.exchanges[:count] for image in exchange.images]

    @property
    def pending_calls(self) -> tuple[FunctionCall, ...]:
        """The calls its last reply made, which await their results (none: it answered)."""
        return self.exchanges[-1].calls if self.exchanges else ()

    def export_state(self) -> dict[str, Any]:
        return {
            "format": self.format.name,
            "system": self.system,
            "system_ids": list(self._system_ids),
            "exchanges": [export_exchange(e) for e in self.exchanges],
        }

    def import_state(self, state: dict[str, Any], ids: IdBudget) -> None:
        """An exported conversation, checked for shape and its ids against ``ids``: it may come
        from another process."""
        try:
            if state["format"] != self.format.name:
                raise ValueError(
                    f"a conversation in the format {state['format']!r}, not {self.format.name!r}"
                )
            system = state["system"]
            system_ids = ids.take(state["system_ids"])
            exchanges = [ids.exchange(e) for e in state["exchanges"]]
        except (KeyError, TypeError) as e:
            raise ValueError(f"not an exported conversation: {e!r}") from e
        if system is not None and not isinstance(system, str):
            raise ValueError("not an exported conversation: system is not a string")
        self.system = system or None
        self._system_ids = system_ids
        self.exchanges = exchanges

    @property
    def images(self) -> list[Any]:
        return self.images_of(len(self.exchanges))

    @property
    def id_count(self) -> int:
        return self.id_count_of(len(self.exchanges))

    def id_count_of(self, count: int) -> int:
        """Its ids, with its first ``count`` exchanges only, as ``IdBudget`` counts them: each
        exchange and each of its rounds counts one more (its markup)."""
        return len(self._system_ids) + sum(_id_count(e) for e in self.exchanges[:count])

    @property
    def generated_tokens(self) -> int:
        """The replies' tokens, the ones that ended them left out (the dashboard's count)."""
        ends = self.format.end_ids
        total = 0
        for exchange in self.exchanges:
            for reply in [*(r.reply_ids for r in exchange.rounds), exchange.reply_ids]:
                total += len(reply) - (1 if reply and reply[-1] in ends else 0)
        return total

    def tokenize_user(self, text: str) -> list[int]:
        return self.format.tokenize_user(text)

    def tokenize_system(self, text: str) -> list[int]:
        return self.format.tokenize_system(text)

    def system_ids(self, tools: Sequence[int] = ()) -> list[int]:
        """What renders as its system prompt: its own, and the tools' description (``tools``,
        its ids) after it where tools are offered."""
        if not tools:
            return self._system_ids
        return self.format.system_with_tools(self._system_ids or None, tools)

    def prompt_ids(
        self,
        user_ids: Sequence[int],
        image_ids: Sequence[Sequence[int]] = (),
        *,
        fresh: bool = False,
        history: int | None = None,
        rounds: Sequence[ToolRound] = (),
        tools: Sequence[int] = (),
    ) -> list[int]:
        """The whole conversation (``history``: its first that many exchanges) plus a new user
        turn (``rounds``: with the replies that called tools and their results after it),
        ending where the model's reply begins; ``fresh``: as it would be after a reset (the
        system prompt and this turn alone); ``tools``: the offered tools' description."""
        kept = [] if fresh else self.exchanges[:history]
        user = UserTurn(list(user_ids), image_ids, rounds)
        return self.format.render(self.system_ids(tools) or None, kept, user)

    def messages(
        self,
        user_ids: Sequence[int],
        images: Sequence[Any],
        history: int | None = None,
        rounds: Sequence[ToolRound] = (),
        tools: Sequence[int] = (),
    ) -> list[Message]:
        """The conversation (``history``: its first that many exchanges) plus a new user turn
        as messages: the ids ``prompt_ids`` renders, turn by turn, and each user turn's
        images."""
        system = self.system_ids(tools)
        out = [Message("system", system)] if system else []
        ends = self.format.end_ids
        for e in self.exchanges[:history]:
            out.append(Message("user", e.user_ids, e.images))
            out += _round_messages(e.rounds, ends)
            out.append(Message("assistant", without_end(e.reply_ids, ends)))
        out.append(Message("user", user_ids, images))
        return out + _round_messages(rounds, ends)

    def opening(self, prompt_ids: Sequence[int], tools: Sequence[int] = ()) -> int:
        """How many leading ``prompt_ids`` (a prompt it rendered) are its format's opening for
        its system prompt: the same in every conversation that has them (0 where the prompt
        does not start with it)."""
        opening = self.format.opening(self.system_ids(tools) or None)
        return len(opening) if list(prompt_ids[: len(opening)]) == opening else 0

    def first_turn_tokens(self, system_ids: Sequence[int]) -> int:
        """The tokens of a first turn with this system prompt and no text: markup included."""
        return len(self.format.render(list(system_ids) or None, [], UserTurn([])))

    def add_exchange(
        self,
        user_ids: list[int],
        image_ids: Sequence[Sequence[int]],
        images: list[Any],
        reply_ids: Sequence[int],
        rounds: Sequence[ToolRound] = (),
        calls: Sequence[FunctionCall] = (),
    ) -> None:
        """Record a finished (or cancelled) exchange exactly as it was prompted and generated."""
        runs = [list(run) for run in image_ids]
        exchange = Exchange(list(user_ids), runs, images, list(reply_ids), list(rounds))
        exchange.calls = tuple(calls)
        self.exchanges.append(exchange)


def _round_messages(rounds: Sequence[ToolRound], ends: frozenset[int]) -> list[Message]:
    """Each reply that called tools, then its results as a user's turn (formats.py)."""
    out = []
    for round_ in rounds:
        out.append(Message("assistant", without_end(round_.reply_ids, ends)))
        out.append(Message("user", round_.result_ids))
    return out


def _id_count(exchange: Exchange) -> int:
    rounds = sum(1 + len(r.reply_ids) + len(r.result_ids) for r in exchange.rounds)
    images = sum(map(len, exchange.image_ids))
    return 1 + len(exchange.user_ids) + images + len(exchange.reply_ids) + rounds


def export_exchange(e: Exchange) -> dict[str, Any]:
    out: dict[str, Any] = {
        "user": e.user_ids,
        "image_ids": e.image_ids,
        "images": list(e.images),
        "reply": e.reply_ids,
    }
    if e.rounds:
        out["rounds"] = [[r.reply_ids, r.result_ids] for r in e.rounds]
    if e.calls:
        out["calls"] = [call.to_data() for call in e.calls]
    return out


class IdBudget:
    """Token ids read back from outside this process (a session store): each one below the
    vocabulary size (an id past it fails the forward pass of every row of a batch), and no
    more of them than ``total``, an exchange and each of its rounds counting one for its markup:
    a live conversation never holds more than its context, so a made-up one is refused rather
    than run."""

    def __init__(self, vocab_size: int | None, total: int, max_images: int) -> None:
        self.below = vocab_size if vocab_size is not None else MAX_TOKEN_ID
        self.left = total
        self.max_images = max_images  # per exchange, as per prompt

    def take(self, value: Any) -> list[int]:
        if not isinstance(value, list):
            raise ValueError("not an exported conversation: ids are not a list")
        self.left -= len(value)
        if self.left < 0:
            raise ValueError("not an exported conversation: more ids than a context holds")
        below = self.below
        if not all(type(i) is int and 0 <= i < below for i in value):
            raise ValueError(f"not an exported conversation: ids outside 0..{below - 1}")
        return value

    def exchange(self, exported: dict[str, Any], reply: Any = None) -> Exchange:
        """``export_exchange``'s data (``reply``: these ids for its last reply instead)."""
        self.left -= 1
        runs = [self.take(run) for run in exported["image_ids"]]
        images = exported["images"]
        if not isinstance(images, list) or len(images) != len(runs):
            raise ValueError("not an exported conversation: images and their ids differ")
        if len(images) > self.max_images:
            raise ValueError(f"not an exported conversation: over {self.max_images} images")
        user = self.take(exported["user"])
        rounds = [self.round(r) for r in exported.get("rounds", ())]
        reply_ids = self.take(exported["reply"] if reply is None else reply)
        calls = () if reply is not None else exported.get("calls", ())
        if not isinstance(calls, list | tuple) or len(calls) > len(reply_ids):
            raise ValueError("not an exported conversation: more calls than a reply makes")
        exchange = Exchange(user, runs, images, reply_ids, rounds)
        exchange.calls = tuple(FunctionCall.of_data(call) for call in calls)
        return exchange

    def round(self, exported: Any) -> ToolRound:
        if not isinstance(exported, list) or len(exported) != 2:
            raise ValueError("not an exported conversation: a tool round is not two id lists")
        self.left -= 1
        return ToolRound(self.take(exported[0]), self.take(exported[1]))
