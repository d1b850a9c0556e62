"""Prompt formats: how a conversation becomes the token ids a model was trained to continue.

A format renders on ids, never on a string of markup: user (and system) text is tokenized as
text, so control-token strings or ``User:`` typed by a user stay text and cannot end or forge a
turn in the conversation's accounting; model turns keep the exact ids the model produced; and
each prompt extends the previous one token for token, so a session's KV state is reused.

``gemma-turns``   Gemma's instruction-tuned turn markup, for Gemma checkpoints without a template::

    <bos><start_of_turn>user\\n{system}\\n\\n{text}<end_of_turn>\\n<start_of_turn>model\\n{reply}...

``chat-template`` the tokenizer's own chat template, rendered with sentinels in place of every
                  text so the markup around them is the template's and the texts are ours.

``transcript``    for pretrained (base) models, which were never tuned on turns and babble inside
                  turn markup, but continue a plain transcript well: an instruction line (the
                  system prompt when one is set), short example exchanges (questions, a code
                  block, a list, a statement remarked on), then ``User: ...`` /
                  ``Assistant:`` lines. A reply may span lines: it ends where the model starts a
                  line with a turn label (it begins the next turn) or at end-of-sequence. The
                  reply's ids are kept up to the line break before the label, which is the next
                  turn's own; neither the label nor those line breaks are ever sent as text.

An exchange that called tools (tools.py) is laid out as more turns of the same two kinds: each
reply that called tools a model turn, the results of its calls the user turn after it (no format
here has a tool role: Gemma 3's template has none), and the tools' description follows the system
prompt (``system_with_tools``).

``auto`` picks: the tokenizer's chat template when it has one; else ``gemma-turns`` for a Gemma
checkpoint that is instruction-tuned (its name says ``-it`` or ``instruct``, or it is one of the
tiny test models that stand in for one); else ``transcript``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .exchanges import Exchange, UserTurn, turns_of, without_end

FORMATS = ("auto", "chat-template", "gemma-turns", "transcript")


class TextCodec(Protocol):
    """What a format needs from a tokenizer."""

    def tokenize_text(self, text: str) -> list[int]:
        """Text as text: control-token strings in it stay ordinary text."""
        ...

    def tokenize_markup(self, text: str) -> list[int]:
        """Markup: control-token strings become their control tokens."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...


class PromptFormat(Protocol):
    name: str
    # Tokens that end a reply: generation stops on them and they are never part of its text.
    end_ids: frozenset[int]
    # A reply that starts after "Assistant:" starts with a space the reader should not see.
    strips_leading_space: bool
    # Where a line starts with one of these, the model has begun the next turn: the reply ends
    # before that line (stopping.StopTexts), and no engine streams the label.
    turn_labels: tuple[str, ...]

    def tokenize_user(self, text: str) -> list[int]:
        """A user's text as this format places it in a turn (always tokenized as text)."""
        ...

    def tokenize_system(self, text: str) -> list[int]:
        """A system prompt's text, tokenized as text."""
        ...

    def render(
        self, system: Sequence[int] | None, history: Sequence[Exchange], user: UserTurn
    ) -> list[int]:
        """The whole conversation (``system``: the system prompt's ids) plus a new user turn,
        ending where the reply begins."""
        ...

    def opening(self, system: Sequence[int] | None) -> list[int]:
        """The ids every render with this system prompt begins with, whatever the history
        and the user turn: the markup and the system prompt before anything a user wrote (the
        engines share its KV state across conversations)."""
        ...

    def system_with_tools(self, system: Sequence[int] | None, tools: Sequence[int]) -> list[int]:
        """What renders as the system prompt where tools are described (``tools``: their
        description's ids): the system prompt, or the format's own opening words, then them."""
        ...


def _with_tools(codec: TextCodec, system: Sequence[int], tools: Sequence[int]) -> list[int]:
    return [*system, *codec.tokenize_text("\n\n"), *tools] if system else list(tools)


class GemmaTurns:
    name = "gemma-turns"
    strips_leading_space = False
    turn_labels: tuple[str, ...] = ()

    def __init__(self, codec: TextCodec, end_ids: frozenset[int]) -> None:
        self._codec = codec
        self.end_ids = end_ids
        (self._bos,) = codec.tokenize_markup("<bos>")
        (self._start,) = codec.tokenize_markup("<start_of_turn>")
        (self._end,) = codec.tokenize_markup("<end_of_turn>")
        self._newline = codec.tokenize_text("\n")
        self._user = codec.tokenize_text("user\n")
        self._model = codec.tokenize_text("model\n")
        self._system_gap = codec.tokenize_text("\n\n")

    def tokenize_user(self, text: str) -> list[int]:
        return self._codec.tokenize_text(text)

    def tokenize_system(self, text: str) -> list[int]:
        return self._codec.tokenize_text(text)

    def render(
        self, system: Sequence[int] | None, history: Sequence[Exchange], user: UserTurn
    ) -> list[int]:
        system_ids = [*system, *self._system_gap] if system else []
        ids = [self._bos]
        pairs, last = turns_of(history, user)
        for n, (content, reply) in enumerate(pairs):
            ids += self._turn(self._user, (system_ids if n == 0 else []) + content)
            ids += self._turn(self._model, without_end(reply, self.end_ids))
        first = system_ids if not pairs else []
        ids += self._turn(self._user, first + last)
        return [*ids, self._start, *self._model]

    def opening(self, system: Sequence[int] | None) -> list[int]:
        system_ids = [*system, *self._system_gap] if system else []
        return [self._bos, self._start, *self._user, *system_ids]

    def system_with_tools(self, system: Sequence[int] | None, tools: Sequence[int]) -> list[int]:
        return _with_tools(self._codec, system or (), tools)

    def _turn(self, role: list[int], content: list[int]) -> list[int]:
        return [self._start, *role, *content, self._end, *self._newline]


# The transcript's default instruction line and examples, so a base model answers in kind: one
# sentence that restates what was asked ("X is Y"), across subjects (shapes, arithmetic, a word
# in Spanish, animals, books, elements, plurals, rivers, years), to questions a user is unlikely
# to ask (an example is a free right answer to its own question, and replies borrow from it); a
# code block and a list on lines of their own, late among them so a request for one gets one;
# and last a remark on a statement, so a statement gets a reply rather than being repeated back.
# None of them is, or gives the answer to, a question of bench/questions.json (a test says so).
# They were chosen on the bench's "new" and "shapes" sets (bench/results/answers-tuning.txt).
TRANSCRIPT_INSTRUCTION = (
    "A conversation between a curious user and a helpful, knowledgeable assistant. "
    "The assistant answers each question correctly in one or two short sentences, with a list "
    "or a code block where one helps."
)
TRANSCRIPT_EXAMPLES = (
    ("How many sides does a hexagon have?", "A hexagon has six sides."),
    ("What is 40 plus 6?", "40 plus 6 is 46."),
    ('What is the Spanish word for "window"?', 'The Spanish word for "window" is "ventana".'),
    ("What do caterpillars turn into?", "Caterpillars turn into butterflies or moths."),
    ("Who wrote the novel The Moonstone?", "Wilkie Collins wrote The Moonstone."),
    ("Which element has the symbol Fe?", "The element with the symbol Fe is iron."),
    ("What is 14 times 5?", "14 times 5 is 70."),
    (
        "Show me how to print a greeting in Python.",
        'Here it is:\n```python\nprint("Welcome!")\n```',
    ),
    ("What is the plural of mouse?", "The plural of mouse is mice."),
    ("Which river flows through Cairo?", "The Nile flows through Cairo."),
    ("Name some kinds of clouds.", "Some kinds of clouds:\n- cumulus\n- stratus\n- cirrus"),
    ("In what year did the Brooklyn Bridge open?", "The Brooklyn Bridge opened in 1883."),
    (
        "I planted tomatoes in my garden today.",
        "That sounds lovely! Homegrown tomatoes taste wonderful.",
    ),
)
TRANSCRIPT_LABELS = ("User:", "Assistant:")


class Transcript:
    name = "transcript"
    strips_leading_space = True

    def __init__(
        self,
        codec: TextCodec,
        eos_ids: frozenset[int],
        newline_ids: frozenset[int],
        *,
        bos: str | None = "<bos>",
        instruction: str = TRANSCRIPT_INSTRUCTION,
        examples: Sequence[tuple[str, str]] = TRANSCRIPT_EXAMPLES,
        labels: tuple[str, str] = TRANSCRIPT_LABELS,
    ) -> None:
        self._codec = codec
        self._newline_ids = newline_ids
        self.end_ids = eos_ids
        self.turn_labels: tuple[str, ...] = labels
        self._bos = codec.tokenize_markup(bos) if bos else []
        self._line = codec.tokenize_text("\n")
        self._gap = codec.tokenize_text("\n\n")
        self._user = codec.tokenize_text(labels[0])
        self._assistant = codec.tokenize_text(labels[1])
        self._instruction = codec.tokenize_text(instruction)
        self._examples: list[int] = []
        for question, answer in examples:
            self._examples += self._user_line(self.tokenize_user(question))
            self._examples += self._assistant + codec.tokenize_text(" " + answer) + self._line

    def tokenize_user(self, text: str) -> list[int]:
        # "User: text": the space belongs to the text's first word, as in the training data.
        return self._codec.tokenize_text(" " + text) if text else []

    def tokenize_system(self, text: str) -> list[int]:
        return self._codec.tokenize_text(text)

    def render(
        self, system: Sequence[int] | None, history: Sequence[Exchange], user: UserTurn
    ) -> list[int]:
        instruction = list(system) if system else self._instruction
        ids = [*self._bos, *instruction, *self._gap, *self._examples]
        pairs, last = turns_of(history, user)
        for content, reply in pairs:
            ids += self._user_line(content)
            ids += self._assistant + self._reply(reply)
        return ids + self._user_line(last) + self._assistant

    def opening(self, system: Sequence[int] | None) -> list[int]:
        instruction = list(system) if system else self._instruction
        return [*self._bos, *instruction, *self._gap, *self._examples, *self._user]

    def system_with_tools(self, system: Sequence[int] | None, tools: Sequence[int]) -> list[int]:
        # the instruction line stays (a system prompt replaces it): the tools follow it
        return _with_tools(self._codec, system or self._instruction, tools)

    def _user_line(self, content: list[int]) -> list[int]:
        return [*self._user, *content, *self._line]

    def _reply(self, reply: Sequence[int]) -> list[int]:
        """The reply as generated up to the line break that ended it (the label the model began
        the next turn with is the next turn's own); a line break closes it if it has none."""
        ids = without_end(reply, self.end_ids)
        breaks = [n for n, i in enumerate(ids) if i in self._newline_ids]
        if breaks and self._codec.decode(ids[breaks[-1] + 1 :]).startswith(self.turn_labels):
            return ids[: breaks[-1] + 1]
        if ids and ids[-1] in self._newline_ids:
            return ids
        return ids + self._line


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> list[int]:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return list(a[:n])


_SENTINEL = "WSCHATSLOT{}X"
_SENTINEL_RE = re.compile(r"WSCHATSLOT(\w+?)X")


@dataclass
class ChatTemplate:
    """The tokenizer's chat template, rendered with a sentinel in place of each text."""

    codec: TextCodec
    render_template: Callable[[list[dict[str, str]]], str]
    end_ids: frozenset[int]
    name: str = "chat-template"
    strips_leading_space: bool = False
    turn_labels: tuple[str, ...] = ()
    _markup: dict[str, list[int]] = field(default_factory=dict)
    # the rendered text before the user's, alone and before an exchange, by whether a system
    # prompt is set: its ids are the sentinels' slots, so one layout serves every system prompt
    _opening_heads: dict[bool, tuple[str, str]] = field(default_factory=dict)

    def tokenize_user(self, text: str) -> list[int]:
        return self.codec.tokenize_text(text)

    def tokenize_system(self, text: str) -> list[int]:
        return self.codec.tokenize_text(text)

    def render(
        self, system: Sequence[int] | None, history: Sequence[Exchange], user: UserTurn
    ) -> list[int]:
        messages: list[dict[str, str]] = []
        slots: dict[str, list[int]] = {}
        if system:
            messages.append({"role": "system", "content": _SENTINEL.format("s")})
            slots["s"] = list(system)
        pairs, last = turns_of(history, user)
        for n, (content, reply) in enumerate(pairs):
            messages.append({"role": "user", "content": _SENTINEL.format(f"u{n}")})
            messages.append({"role": "assistant", "content": _SENTINEL.format(f"a{n}")})
            slots[f"u{n}"] = content
            slots[f"a{n}"] = without_end(reply, self.end_ids)
        messages.append({"role": "user", "content": _SENTINEL.format("new")})
        slots["new"] = last
        return self._ids(self.render_template(messages), slots)

    def system_with_tools(self, system: Sequence[int] | None, tools: Sequence[int]) -> list[int]:
        return _with_tools(self.codec, system or (), tools)

    def opening(self, system: Sequence[int] | None) -> list[int]:
        """What renders before the first user turn's text, alone and followed by an exchange
        (a template may lay out a first turn differently once others follow): the part the
        two share."""
        with_system = bool(system)
        if with_system not in self._opening_heads:
            first = [{"role": "system", "content": _SENTINEL.format("s")}] if system else []
            user = {"role": "user", "content": _SENTINEL.format("u")}
            reply = {"role": "assistant", "content": "A"}
            alone = self.render_template([*first, user])
            followed = self.render_template([*first, user, reply, user])
            user_at = _SENTINEL.format("u")
            self._opening_heads[with_system] = (
                alone[: alone.index(user_at)],
                followed[: followed.index(user_at)],
            )
        slots = {"s": list(system or ())}
        heads = self._opening_heads[with_system]
        return _common_prefix(*(self._ids(head, slots) for head in heads))

    def _ids(self, rendered: str, slots: dict[str, list[int]]) -> list[int]:
        ids: list[int] = []
        for n, piece in enumerate(_SENTINEL_RE.split(rendered)):
            ids += slots[piece] if n % 2 else self._markup_ids(piece)
        return ids

    def _markup_ids(self, text: str) -> list[int]:
        if text not in self._markup:
            self._markup[text] = self.codec.tokenize_markup(text)
        return self._markup[text]


@dataclass(frozen=True, slots=True)
class FormatHints:
    """What ``auto`` looks at."""

    has_chat_template: bool
    has_gemma_turns: bool  # the vocabulary has <start_of_turn> and <end_of_turn>
    instruction_tuned: bool


def choose_format(requested: str, hints: FormatHints) -> str:
    """The format ``requested`` names, ``auto`` resolved by the rule in the module docstring."""
    if requested not in FORMATS:
        raise ValueError(f"unknown prompt format {requested!r}: choose one of {FORMATS}")
    if requested != "auto":
        return requested
    if hints.has_chat_template:
        return "chat-template"
    if hints.has_gemma_turns and hints.instruction_tuned:
        return "gemma-turns"
    return "transcript"


_INSTRUCTION_TUNED = re.compile(r"(?i)(\b|[-_])(it|instruct|chat)(\b|[-_])")


def looks_instruction_tuned(name: str) -> bool:
    """``gemma-3-4b-it``, ``...-Instruct``: the naming convention of tuned checkpoints."""
    return bool(_INSTRUCTION_TUNED.search(name))


class TokenizerCodec:
    """A transformers tokenizer as a ``TextCodec``."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def tokenize_text(self, text: str) -> list[int]:
        encoded = self._tokenizer(text, add_special_tokens=False, split_special_tokens=True)
        return list(encoded["input_ids"])

    def tokenize_markup(self, text: str) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids)))


def newline_ids(tokenizer: Any) -> frozenset[int]:
    """Every token whose text holds a line break (runs of ``\\n``, the byte ``<0x0A>``)."""
    return frozenset(
        i for token, i in tokenizer.get_vocab().items() if "\n" in token or token == "<0x0A>"
    )


def build_format(
    requested: str, tokenizer: Any, eos_ids: frozenset[int], *, instruction_tuned: bool
) -> PromptFormat:
    """The format ``requested`` names (``auto`` resolved) for a transformers tokenizer."""
    vocab = tokenizer.get_vocab()
    hints = FormatHints(
        has_chat_template=bool(getattr(tokenizer, "chat_template", None)),
        has_gemma_turns="<start_of_turn>" in vocab and "<end_of_turn>" in vocab,
        instruction_tuned=instruction_tuned,
    )
    name = choose_format(requested, hints)
    codec = TokenizerCodec(tokenizer)
    if name == "chat-template":
        if not hints.has_chat_template:
            raise ValueError("the tokenizer has no chat template: pick another prompt format")
        return ChatTemplate(codec, _template_renderer(tokenizer), eos_ids)
    if name == "gemma-turns":
        if not hints.has_gemma_turns:
            raise ValueError("the vocabulary has no Gemma turn markers: pick another format")
        return GemmaTurns(codec, eos_ids)
    bos = getattr(tokenizer, "bos_token", None)
    return Transcript(codec, eos_ids, newline_ids(tokenizer), bos=bos)


def _template_renderer(tokenizer: Any) -> Callable[[list[dict[str, str]]], str]:
    def render(messages: list[dict[str, str]]) -> str:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return str(text)

    return render
