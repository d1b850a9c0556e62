"""A conversation as exact token ids per turn, and ``Chat``: a session's conversation, the same
for every engine (in this process or over HTTP).

``Conversation`` holds a session's system prompt and finished exchanges as they were prompted
and generated, and renders them with the engine's prompt format (``formats.py``: how each format
lays out turns), so each prompt extends the last one token for token. No torch here: an engine
that only has a ``tokenizers`` tokenizer renders the same prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wschat.protocol import FinishReason

from .base import Engine, Finished, Generation, GenerationRequest, Message, SamplingParams, Turn
from .errors import ConversationTooLong, PromptTooLong
from .formats import Exchange, PromptFormat, UserTurn, without_end

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
        return self.images_of(len(self.exchanges))

    @property
    def id_count(self) -> int:
        return self.id_count_of(len(self.exchanges))

    def id_count_of(self, count: int) -> int:
        """Its ids, with its first ``count`` exchanges only, as ``IdBudget`` counts them: each
        exchange counts one more (its markup)."""
        return len(self._system_ids) + sum(
            1 + len(e.user_ids) + sum(map(len, e.image_ids)) + len(e.reply_ids)
            for e in self.exchanges[:count]
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
        history: int | None = None,
    ) -> list[int]:
        """The whole conversation (``history``: its first that many exchanges) plus a new user
        turn, ending where the model's reply begins; ``fresh``: as it would be after a reset
        (the system prompt and this turn alone)."""
        kept = [] if fresh else self.exchanges[:history]
        user = UserTurn(list(user_ids), image_ids)
        return self.format.render(self._system_ids or None, kept, user)

    def messages(
        self, user_ids: Sequence[int], images: Sequence[Any], history: int | None = None
    ) -> list[Message]:
        """The conversation (``history``: its first that many exchanges) plus a new user turn
        as messages: the ids ``prompt_ids`` renders, turn by turn, and each user turn's
        images."""
        out = [Message("system", self._system_ids)] if self._system_ids else []
        for e in self.exchanges[:history]:
            out.append(Message("user", e.user_ids, e.images))
            out.append(Message("assistant", without_end(e.reply_ids, self.format.end_ids)))
        out.append(Message("user", user_ids, images))
        return out

    def opening(self, prompt_ids: Sequence[int]) -> int:
        """How many leading ``prompt_ids`` (a prompt it rendered) are its format's opening for
        its system prompt: the same in every conversation that has them (0 where the prompt
        does not start with it)."""
        opening = self.format.opening(self._system_ids or None)
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


@dataclass(frozen=True, slots=True)
class PreparedTurn:
    """A turn counted and checked against the context: ``Chat.start`` runs it as it is."""

    turn: Turn
    user_tokens: int  # the user's text alone
    prompt_tokens: int  # the whole prompt the model reads (the conversation and this turn)
    user_ids: list[int]
    image_ids: list[list[int]]  # one placeholder run per image
    prompt_ids: list[int]
    messages: list[Message]  # the same prompt as messages
    # the exchanges it is prompted after: once kept, it is exchange ``history + 1`` and every
    # later one is dropped (a regenerate replaces the last; a prompt adds one after them all)
    history: int = 0
    replaces: bool = False  # a regenerate: the exchange it follows up on is replaced

    @property
    def index(self) -> int:
        """Its number in the conversation once kept, from 1 (``done.turn``)."""
        return self.history + 1


class Chat:
    """A session's conversation kept as token ids; ``GenerationRequest``s for its engine."""

    def __init__(self, engine: Engine, key: str) -> None:
        self._engine = engine
        self.key = key  # what the engine keeps for it is under this key
        self.conversation = Conversation(engine.prompt_format)
        self._running: tuple[Generation, PreparedTurn] | None = None

    @property
    def system(self) -> str | None:
        return self.conversation.system

    @property
    def turns(self) -> int:
        """Finished (or cancelled) exchanges."""
        return len(self.conversation.exchanges)

    @property
    def generated_tokens(self) -> int:
        """The replies' tokens, the ones that ended them left out (the dashboard's count)."""
        return self.conversation.generated_tokens

    @property
    def images(self) -> list[Any]:
        """Every image it holds: its exchanges' and the running turn's (a regenerate's are the
        last exchange's own)."""
        running = self._running[1] if self._running else None
        extra = list(running.turn.images) if running and not running.replaces else []
        return [*self.conversation.images, *extra]

    async def set_system(self, text: str | None, *, min_turn_tokens: int) -> None:
        """A new system prompt (None or empty: none) starts the conversation afresh; raises
        ``PromptTooLong`` (and changes nothing) when it leaves no room for a turn of
        ``min_turn_tokens``."""
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
        """Count the turn: ``PromptTooLong`` over ``max_user_tokens`` of text,
        ``ConversationTooLong`` when the conversation and it do not fit the context. Changes
        nothing."""
        conversation = self.conversation
        user = await self._engine.text_tokenizer.tokenize(conversation.tokenize_user, turn.text)
        if len(user) > max_user_tokens:
            raise PromptTooLong(f"prompt is over {max_user_tokens} tokens")
        placeholder = self._engine.image_placeholder_ids() if turn.images else []
        images = [list(placeholder) for _ in turn.images]
        return self._fitted(turn, user, images, self.turns)

    def prepare_regenerate(self, params: SamplingParams) -> PreparedTurn:
        """The last exchange's user turn (its text and images, as they were prompted) again,
        after the exchanges before it: ``ConversationTooLong`` when that does not fit the
        context (``params`` may allow a longer reply). The old exchange stays until the new
        reply is kept (``start``); a reply that fails, or never starts, leaves it. Changes
        nothing; ``ValueError`` when there is no exchange."""
        if not self.conversation.exchanges:
            raise ValueError("the conversation holds no exchange to regenerate")
        last = self.conversation.exchanges[-1]
        turn = Turn("", params, list(last.images))  # the text is needed only as its ids
        runs = [list(run) for run in last.image_ids]
        return self._fitted(turn, list(last.user_ids), runs, self.turns - 1, replaces=True)

    def _fitted(
        self,
        turn: Turn,
        user: list[int],
        images: list[list[int]],
        history: int,
        *,
        replaces: bool = False,
    ) -> PreparedTurn:
        """The turn after the first ``history`` exchanges, if that fits the context."""
        conversation = self.conversation
        prompt = conversation.prompt_ids(user, images, history=history)
        context = self._engine.info.context_tokens
        if len(prompt) >= context:
            fresh = conversation.prompt_ids(user, images, fresh=True)
            # advise a reset only where one makes room: never a loop of resets
            advice = "reset to start afresh" if len(fresh) < context else "shorten the prompt"
            raise ConversationTooLong(
                f"the conversation needs {len(prompt)} tokens; the context holds {context}"
                f" ({advice})"
            )
        messages = conversation.messages(user, turn.images, history)
        return PreparedTurn(
            turn, len(user), len(prompt), user, images, prompt, messages, history, replaces
        )

    def start(
        self, prepared: PreparedTurn, *, key: str | None = None, scope: str = ""
    ) -> Generation:
        """Begin the reply (on the event loop) under the engine session ``key`` (None: the
        chat's); ``scope``: whose sessions share cached state (its owner's, as the web layer
        derives it): an opening with a system prompt, and on a remote engine every prompt; an
        opening without a system prompt every session shares. The exchange joins the
        conversation when its ``Finished`` comes, unless the generation failed."""
        turn = prepared.turn
        request = GenerationRequest(
            prepared.prompt_ids,
            turn.params,
            [*self.conversation.images_of(prepared.history), *turn.images],
            key or self.key,
            new_images=len(turn.images),
            messages=prepared.messages,
            opening=self.conversation.opening(prepared.prompt_ids),
            opening_scope=scope if self.conversation.system else "",
            cache_scope=scope,
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
        del self.conversation.exchanges[prepared.history :]  # what a regenerate replaces
        self.conversation.add_exchange(
            prepared.user_ids,
            prepared.image_ids,
            list(prepared.turn.images),
            finished.completion_ids,
        )

    def rewind(self, keep: int) -> None:
        """Keep the first ``keep`` exchanges (0 .. ``turns``) and drop the rest; ``ValueError``
        beyond them. What the engine caches for the session stays: the next prompt starts with
        the kept exchanges, a prefix of what it cached, and the engine reuses that much."""
        if not 0 <= keep <= self.turns:
            raise ValueError(f"the conversation holds {self.turns} exchanges, not {keep}")
        del self.conversation.exchanges[keep:]

    def reset(self) -> None:
        """Forget the exchanges (the system prompt stays)."""
        self._running = None
        self.conversation.clear()
        self._engine.forget(self.key)

    def close(self) -> None:
        """The session is gone: drop what the engine keeps for it."""
        self._engine.forget(self.key)

    def export_state(self) -> dict[str, Any]:
        """The conversation as plain data (str, int, lists, dicts; images in the engine's form)
        from which ``import_state`` rebuilds it exactly, in this process or another one with
        the same engine. A running turn is not part of it."""
        return self.conversation.export_state()

    def import_state(self, state: dict[str, Any]) -> None:
        """Replace the conversation with an exported one; ``ValueError`` when it is not one."""
        self._running = None
        self.conversation.import_state(state, self._id_budget(0))
        self._engine.forget(self.key)  # KV state kept for this key was another conversation's

    def export_running(self) -> dict[str, Any] | None:
        """The running turn as it was prompted, as plain data (None when none runs): what
        ``add_cancelled`` needs to keep it, should the process generating it die."""
        if self._running is None:
            return None
        prepared = self._running[1]
        images = list(prepared.turn.images)
        running = {"user": prepared.user_ids, "image_ids": prepared.image_ids, "images": images}
        return {**running, "replaces": True} if prepared.replaces else running

    def add_cancelled(self, running: dict[str, Any], reply_ids: Sequence[int]) -> None:
        """A turn ``export_running`` gave (maybe in another process) joins the conversation as
        a cancelled exchange whose reply is ``reply_ids`` (in place of the last, for a
        regenerate's); ``ValueError`` when it is not one."""
        exchanges = self.conversation.exchanges
        history = len(exchanges) - 1 if running.get("replaces") and exchanges else len(exchanges)
        ids = self._id_budget(self.conversation.id_count_of(history))
        try:
            exchange = ids.exchange(
                running["user"], running["image_ids"], running["images"], list(reply_ids)
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"not an exported running turn: {e!r}") from e
        del exchanges[history:]
        exchanges.append(exchange)

    def _id_budget(self, used: int) -> IdBudget:
        """Twice the context: a live conversation holds at most its context and one reply."""
        info = self._engine.info
        return IdBudget(info.vocab_size, 2 * info.context_tokens - used, info.max_images)
