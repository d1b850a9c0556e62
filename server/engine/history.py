"""A conversation as exact token ids per turn, and ``TokenChat``: the ``Chat`` of every engine
that is prompted with token ids (in this process or over HTTP).

``Conversation`` holds a session's system prompt and finished exchanges as they were prompted
and generated, and renders them with the engine's prompt format (``formats.py``: how each format
lays out turns), so each prompt extends the last one token for token. No torch here: an engine
that only has a ``tokenizers`` tokenizer renders the same prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from wschat.protocol import FinishReason

from .base import EngineInfo, Finished, Generation, GenerationRequest, PreparedTurn, Turn
from .errors import ConversationTooLong, PromptTooLong
from .formats import Exchange, PromptFormat, UserTurn
from .tokenizing import TextTokenizer

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

    def export_state(self) -> dict[str, Any]:
        return {
            "format": self.format.name,
            "system": self.system,
            "system_ids": list(self._system_ids),
            "exchanges": [
                {
                    "user": e.user_ids,
                    "image_ids": e.image_ids,
                    "images": list(e.images),
                    "reply": e.reply_ids,
                }
                for e in self.exchanges
            ],
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
            exchanges = [
                ids.exchange(e["user"], e["image_ids"], e["images"], e["reply"])
                for e in state["exchanges"]
            ]
        except (KeyError, TypeError) as e:
            raise ValueError(f"not an exported conversation: {e!r}") from e
        if system is not None and not isinstance(system, str):
            raise ValueError("not an exported conversation: system is not a string")
        self.system = system or None
        self._system_ids = system_ids
        self.exchanges = exchanges

    @property
    def images(self) -> list[Any]:
        return [image for exchange in self.exchanges for image in exchange.images]

    @property
    def id_count(self) -> int:
        """Its ids as ``IdBudget`` counts them: each exchange counts one more (its markup)."""
        return len(self._system_ids) + sum(
            1 + len(e.user_ids) + sum(map(len, e.image_ids)) + len(e.reply_ids)
            for e in self.exchanges
        )

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


class IdBudget:
    """Token ids read back from outside this process (a session store): each one below the
    vocabulary size (an id past it fails the forward pass of every row of a batch), and no
    more of them than ``total``, an exchange counting one for its markup: a live conversation
    never holds more than its context, so a made-up one is refused rather than run."""

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

    def exchange(self, user: Any, image_ids: Any, images: Any, reply: Any) -> Exchange:
        self.left -= 1
        runs = [self.take(run) for run in image_ids]
        if not isinstance(images, list) or len(images) != len(runs):
            raise ValueError("not an exported conversation: images and their ids differ")
        if len(images) > self.max_images:
            raise ValueError(f"not an exported conversation: over {self.max_images} images")
        return Exchange(self.take(user), runs, images, self.take(reply))


class Prompted(Protocol):
    """What ``TokenChat`` needs of an engine prompted with token ids."""

    info: EngineInfo
    prompt_format: PromptFormat
    text_tokenizer: TextTokenizer  # one per engine: long texts go to one worker thread

    def image_placeholder_ids(self) -> list[int]:
        """The prompt ids one image occupies; ``ImagesUnsupported`` without a vision tower."""
        ...

    def generate(self, request: GenerationRequest) -> Generation:
        """Begin generating (on the event loop)."""
        ...

    def forget(self, session_key: str) -> None:
        """Drop the session's cached KV state."""
        ...


@dataclass(frozen=True, slots=True)
class _Ids:
    user: list[int]
    images: list[list[int]]  # one placeholder run per image
    prompt: list[int]


class TokenChat:
    """A session's conversation kept as token ids; ``GenerationRequest``s for its engine."""

    def __init__(self, engine: Prompted, key: str) -> None:
        self._engine = engine
        self.key = key
        self.conversation = Conversation(engine.prompt_format)
        self._running: tuple[Generation, PreparedTurn] | None = None

    @property
    def system(self) -> str | None:
        return self.conversation.system

    @property
    def turns(self) -> int:
        return len(self.conversation.exchanges)

    @property
    def generated_tokens(self) -> int:
        return self.conversation.generated_tokens

    @property
    def images(self) -> list[Any]:
        running = list(self._running[1].turn.images) if self._running else []
        return [*self.conversation.images, *running]

    async def set_system(self, text: str | None, *, min_turn_tokens: int) -> None:
        conversation = self.conversation
        ids = await self._system_ids(text, min_turn_tokens) if text else []
        conversation.set_system(text, ids)
        self._engine.forget(self.key)

    async def _system_ids(self, text: str, min_turn_tokens: int) -> list[int]:
        """Its tokens; too large when they leave no room for a turn, which no reset could ever
        make (PROTOCOL.md "configure")."""
        conversation = self.conversation
        ids = await self._engine.text_tokenizer.tokenize(conversation.tokenize_system, text)
        context = self._engine.info.context_tokens
        markup = conversation.first_turn_tokens(ids) - len(ids)
        longest = context - min_turn_tokens - markup
        if len(ids) > longest:
            raise PromptTooLong(
                f"the system prompt is {len(ids)} tokens; a context of {context} holds at most"
                f" {max(longest, 0)} with room for a turn"
            )
        return ids

    async def prepare(self, turn: Turn, *, max_user_tokens: int) -> PreparedTurn:
        conversation = self.conversation
        user = await self._engine.text_tokenizer.tokenize(conversation.tokenize_user, turn.text)
        if len(user) > max_user_tokens:
            raise PromptTooLong(f"prompt is over {max_user_tokens} tokens")
        placeholder = self._engine.image_placeholder_ids() if turn.images else []
        images = [list(placeholder) for _ in turn.images]
        prompt = conversation.prompt_ids(user, images)
        context = self._engine.info.context_tokens
        if len(prompt) >= context:
            fresh = conversation.prompt_ids(user, images, fresh=True)
            # advise a reset only where one makes room: never a loop of resets
            advice = "reset to start afresh" if len(fresh) < context else "shorten the prompt"
            raise ConversationTooLong(
                f"the conversation needs {len(prompt)} tokens; the context holds {context}"
                f" ({advice})"
            )
        return PreparedTurn(turn, len(user), len(prompt), _Ids(user, images, prompt))

    def start(self, prepared: PreparedTurn) -> Generation:
        ids = prepared.rendered
        assert isinstance(ids, _Ids), "a turn prepared by another chat"
        turn = prepared.turn
        request = GenerationRequest(
            ids.prompt,
            turn.params,
            [*self.conversation.images, *turn.images],
            self.key,
            new_images=len(turn.images),
        )
        generation = self._engine.generate(request)
        self._running = (generation, prepared)
        generation.on_finish.append(lambda finished: self._record(generation, finished))
        return generation

    def _record(self, generation: Generation, finished: Finished) -> None:
        """The exchange as it was prompted and generated; a failed one is left out."""
        if self._running is None or self._running[0] is not generation:
            return  # a reset or a later turn came first: this one is no longer wanted
        prepared = self._running[1]
        self._running = None
        if finished.reason is FinishReason.ERROR:
            return
        ids = prepared.rendered
        self.conversation.add_exchange(
            ids.user, ids.images, list(prepared.turn.images), finished.completion_ids
        )

    def reset(self) -> None:
        self._running = None
        self.conversation.clear()
        self._engine.forget(self.key)

    def close(self) -> None:
        self._engine.forget(self.key)

    def export_state(self) -> dict[str, Any]:
        return self.conversation.export_state()

    def import_state(self, state: dict[str, Any]) -> None:
        self._running = None
        self.conversation.import_state(state, self._id_budget(0))
        self._engine.forget(self.key)  # KV state kept for this key was another conversation's

    def export_running(self) -> dict[str, Any] | None:
        if self._running is None:
            return None
        prepared = self._running[1]
        ids = prepared.rendered
        assert isinstance(ids, _Ids)
        return {"user": ids.user, "image_ids": ids.images, "images": list(prepared.turn.images)}

    def add_cancelled(self, running: dict[str, Any], reply_ids: Sequence[int]) -> None:
        ids = self._id_budget(self.conversation.id_count)
        try:
            exchange = ids.exchange(
                running["user"], running["image_ids"], running["images"], list(reply_ids)
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"not an exported running turn: {e!r}") from e
        self.conversation.exchanges.append(exchange)

    def _id_budget(self, used: int) -> IdBudget:
        """Twice the context: a live conversation holds at most its context and one reply."""
        info = self._engine.info
        return IdBudget(info.vocab_size, 2 * info.context_tokens - used, info.max_images)
