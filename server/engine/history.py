"""``Chat``: a session's conversation (conversation.py: exact token ids per turn), the same for
every engine (in this process or over HTTP): each turn counted against the context before it
runs, then started as a ``GenerationRequest``, and its exchange kept once its reply ends.

A turn is a user's (``prepare``), the last one's again (``prepare_regenerate``: the exchange and
its tool rounds replaced), or the results of the calls the last reply made (``prepare_results``:
the exchange goes on, one tool round longer, under the same number). No torch here.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wschat.protocol import FinishReason
from wschat.protocol.tools import ToolResult

from .base import Engine, Finished, Generation, GenerationRequest, Message, SamplingParams, Turn
from .conversation import Conversation, IdBudget
from .errors import CallArgumentsInvalid, ConversationTooLong, PromptTooLong
from .exchanges import Exchange, ToolRound
from .stopping import token_budget
from .tools import CallsInvalid, FunctionCall, ToolUse, read_calls, results_text

__all__ = ["Chat", "Conversation", "PreparedTurn"]


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
    # a regenerate, or tool results: the exchange it follows up on is replaced (by itself again
    # for a regenerate, one tool round longer for results)
    replaces: bool = False
    rounds: tuple[ToolRound, ...] = ()  # the exchange's replies that called tools, and results
    tools: tuple[int, ...] = ()  # the offered tools' description, as its system prompt has it
    call_seed: str = ""  # its reply's calls' ids begin with it (tools.py ``call_id``)

    @property
    def index(self) -> int:
        """Its number in the conversation once kept, from 1 (``done.turn``)."""
        return self.history + 1

    def calls_in(self, text: str) -> tuple[FunctionCall, ...] | None:
        """The calls its reply, whole, makes (None: text); ``CallsInvalid`` for a broken one."""
        return read_calls(text, self.turn.tools, self.call_seed)


class Chat:
    """A session's conversation kept as token ids; ``GenerationRequest``s for its engine."""

    def __init__(self, engine: Engine, key: str) -> None:
        self._engine = engine
        self.key = key  # what the engine keeps for it is under this key
        self.conversation = Conversation(engine.prompt_format)
        self._running: tuple[Generation, PreparedTurn] | None = None
        self._tools: tuple[str, list[int]] = ("", [])  # the last tools described, and their ids
        # a reply ended after the calls it wrote whole (``end_after_calls``), and those calls
        self._after_calls: tuple[Generation, tuple[FunctionCall, ...]] | None = None
        self._recorded: tuple[Generation, Exchange] | None = None  # the last reply kept

    @property
    def pending_calls(self) -> tuple[FunctionCall, ...]:
        """The calls the last reply made, which await their results (``prepare_results``)."""
        return self.conversation.pending_calls

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
        tools = await self._tool_ids(turn.tools)
        return self._fitted(turn, user, images, self.turns, tools=tools)

    async def prepare_regenerate(
        self, params: SamplingParams, tools: ToolUse | None = None
    ) -> PreparedTurn:
        """The last exchange's user turn (its text and images, as they were prompted) again,
        after the exchanges before it, its tool rounds left out: ``ConversationTooLong`` when
        that does not fit the context (``params`` may allow a longer reply). The old exchange
        stays until the new reply is kept (``start``); a reply that fails, or never starts,
        leaves it. Changes nothing; ``ValueError`` when there is no exchange."""
        if not self.conversation.exchanges:
            raise ValueError("the conversation holds no exchange to regenerate")
        last = self.conversation.exchanges[-1]
        turn = Turn("", params, list(last.images), tools)  # its text is needed only as its ids
        runs = [list(run) for run in last.image_ids]
        ids = await self._tool_ids(tools)
        return self._fitted(turn, list(last.user_ids), runs, self.turns - 1, tools=ids, again=True)

    async def prepare_results(
        self, results: Sequence[ToolResult], params: SamplingParams, tools: ToolUse | None
    ) -> PreparedTurn:
        """The results of the calls the last reply made, one per call (the caller checked
        them against ``pending_calls``), as the next turn of the same exchange: the reply that
        follows them replaces it, one tool round longer, once kept. ``ConversationTooLong``
        when that does not fit the context; changes nothing."""
        calls = self.pending_calls
        if sorted(r.call_id for r in results) != sorted(c.id for c in calls):
            raise ValueError("the results do not answer the calls that await them")
        conversation, last = self.conversation, self.conversation.exchanges[-1]
        text = results_text(calls, results)
        result_ids = await self._engine.text_tokenizer.tokenize(conversation.tokenize_user, text)
        rounds = (*last.rounds, ToolRound(list(last.reply_ids), result_ids))
        turn = Turn("", params, list(last.images), tools)
        runs = [list(run) for run in last.image_ids]
        ids = await self._tool_ids(tools)
        history = self.turns - 1
        return self._fitted(turn, list(last.user_ids), runs, history, tools=ids, rounds=rounds)

    async def _tool_ids(self, tools: ToolUse | None) -> list[int]:
        """The ids of the tools' description (none where none is offered), kept for the next
        turn that offers the same."""
        if tools is None or not tools.described:
            return []
        if self._tools[0] != tools.key:
            tokenize = self.conversation.tokenize_system  # text as text, in every format
            ids = await self._engine.text_tokenizer.tokenize(tokenize, tools.key)
            self._tools = (tools.key, ids)
        return self._tools[1]

    def _fitted(
        self,
        turn: Turn,
        user: list[int],
        images: list[list[int]],
        history: int,
        *,
        tools: list[int],
        rounds: tuple[ToolRound, ...] = (),
        again: bool = False,
    ) -> PreparedTurn:
        """The turn after the first ``history`` exchanges, if that fits the context."""
        conversation = self.conversation
        prompt = conversation.prompt_ids(user, images, history=history, rounds=rounds, tools=tools)
        context = self._engine.info.context_tokens
        if len(prompt) >= context:
            fresh = conversation.prompt_ids(user, images, fresh=True, rounds=rounds, tools=tools)
            # advise a reset only where one makes room: never a loop of resets
            advice = "reset to start afresh" if len(fresh) < context else "shorten the prompt"
            raise ConversationTooLong(
                f"the conversation needs {len(prompt)} tokens; the context holds {context}"
                f" ({advice})"
            )
        messages = conversation.messages(user, turn.images, history, rounds, tools)
        seed = secrets.token_hex(6) if tools else ""
        replaces = again or bool(rounds)
        shape = (history, replaces, rounds, tuple(tools), seed)
        return PreparedTurn(turn, len(user), len(prompt), user, images, prompt, messages, *shape)

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
            opening=self.conversation.opening(prepared.prompt_ids, prepared.tools),
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
        after, self._after_calls = self._after_calls, None
        if finished.reason is FinishReason.ERROR:
            return
        try:
            calls = prepared.calls_in(finished.text) or ()
        except CallArgumentsInvalid:  # a call that breaks its schema is a failed reply
            return
        except CallsInvalid:  # cut short: by its budget or a cancel, no call (PROTOCOL.md)
            calls = after[1] if after is not None and after[0] is generation else ()
        del self.conversation.exchanges[prepared.history :]  # what a regenerate replaces
        self.conversation.add_exchange(
            prepared.user_ids,
            prepared.image_ids,
            list(prepared.turn.images),
            finished.completion_ids,
            prepared.rounds,
            calls,
        )
        self._recorded = (generation, self.conversation.exchanges[-1])

    def budget(self, prepared: PreparedTurn) -> int:
        """The most tokens its reply may have (stopping.py ``token_budget``)."""
        context = self._engine.info.context_tokens
        return token_budget(prepared.turn.params.max_new_tokens, context, prepared.prompt_tokens)

    def end_after_calls(self, generation: Generation, calls: Sequence[FunctionCall]) -> None:
        """End the reply after ``calls``, those it wrote whole (``CallReader.full``): its
        exchange keeps them as its calls, awaiting results, though their list never closed
        (where its whole text makes calls, those are kept: the reader handed them all out).
        The reply may have ended already, its exchange kept with no call."""
        generation.cancel()
        if self._running is not None and self._running[0] is generation:
            self._after_calls = (generation, tuple(calls))
        elif self._recorded is not None and self._recorded[0] is generation:
            exchange = self._recorded[1]
            exchanges = self.conversation.exchanges
            if exchanges and exchanges[-1] is exchange and not exchange.calls:
                exchange.calls = tuple(calls)

    def discard(self, generation: Generation) -> None:
        """Keep no exchange of ``generation``, a reply that failed after the engine's end or
        before it (a call whose arguments break its schema, seen as it streamed): it is
        cancelled; if its exchange was kept already, the conversation drops it."""
        generation.cancel()
        if self._running is not None and self._running[0] is generation:
            self._running = None
        elif self._recorded is not None and self._recorded[0] is generation:
            exchanges = self.conversation.exchanges
            if exchanges and exchanges[-1] is self._recorded[1]:
                exchanges.pop()
            self._recorded = None

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
        running: dict[str, Any] = {
            "user": prepared.user_ids,
            "image_ids": prepared.image_ids,
            "images": images,
        }
        if prepared.rounds:
            running["rounds"] = [[r.reply_ids, r.result_ids] for r in prepared.rounds]
        return {**running, "replaces": True} if prepared.replaces else running

    def add_cancelled(self, running: dict[str, Any], reply_ids: Sequence[int]) -> None:
        """A turn ``export_running`` gave (maybe in another process) joins the conversation as
        a cancelled exchange whose reply is ``reply_ids`` (in place of the last, for a
        regenerate's or tool results'); ``ValueError`` when it is not one."""
        exchanges = self.conversation.exchanges
        history = len(exchanges) - 1 if running.get("replaces") and exchanges else len(exchanges)
        ids = self._id_budget(self.conversation.id_count_of(history))
        try:
            exchange = ids.exchange(running, list(reply_ids))
        except (KeyError, TypeError) as e:
            raise ValueError(f"not an exported running turn: {e!r}") from e
        del exchanges[history:]
        exchanges.append(exchange)

    def _id_budget(self, used: int) -> IdBudget:
        """Twice the context: a live conversation holds at most its context and one reply."""
        info = self._engine.info
        return IdBudget(info.vocab_size, 2 * info.context_tokens - used, info.max_images)
