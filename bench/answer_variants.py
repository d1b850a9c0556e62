"""The transcript formats ``python -m bench.answers --variant NAME`` measures, as data.

A variant is the server's ``transcript`` format with other examples, instruction line or turn
labels; ``default`` is the server's own, untouched. Their examples must not be a question of
bench/questions.json or close to one (a test says so): they would measure recall, not skill.
bench/results/answers-tuning.txt has the rates of those tried for the format whose replies span
lines; bench/results/answers-variants.json those of the one-line format before it.
"""

from __future__ import annotations

from dataclasses import dataclass

from wschat.server.engine.formats import (
    TRANSCRIPT_EXAMPLES,
    TRANSCRIPT_INSTRUCTION,
    TRANSCRIPT_LABELS,
)

Example = tuple[str, str]  # a question and its answer, as the transcript shows them


@dataclass(frozen=True, slots=True)
class Variant:
    """What a variant renders with; a field left out is the server's own."""

    examples: tuple[Example, ...] = TRANSCRIPT_EXAMPLES
    instruction: str = TRANSCRIPT_INSTRUCTION
    labels: tuple[str, str] = TRANSCRIPT_LABELS


# The one-line format's examples.
_THREE = (
    ("What is the capital of Italy?", "The capital of Italy is Rome."),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci painted the Mona Lisa."),
    ("How many legs does a spider have?", "A spider has eight legs."),
)
_STATEMENT = ("I baked bread this morning.", "That sounds lovely! Did it turn out well?")
_MEMORY = (
    ("I keep my keys in the kitchen drawer.", "That is a handy place for them."),
    ("Where do I keep my keys?", "You keep your keys in the kitchen drawer."),
)
_MORE = (
    *_THREE,
    ("How much is 30 minus 4?", "30 minus 4 is 26."),
    ("What are the three states of matter?", "Solid, liquid and gas."),
    ('What is the Spanish word for "dog"?', 'The Spanish word for "dog" is "perro".'),
    _STATEMENT,
    ("I keep my keys in the kitchen drawer.", "Good idea, they will be easy to find there."),
    _MEMORY[1],
)
_SENTENCES = (
    *_THREE,
    _MORE[3],
    (
        "What are the three states of matter?",
        "The three states of matter are solid, liquid and gas.",
    ),
    _STATEMENT,
    *_MEMORY,
)
_YOU = (
    "A conversation between a user and a helpful, knowledgeable assistant. The assistant "
    'answers each question correctly in one short sentence, speaks to the user as "you" and '
    "remembers what the user said."
)
_HUMAN_AI = ("Human:", "AI:")

# The examples of the format whose replies span lines.
_HEXAGON = ("How many sides does a hexagon have?", "A hexagon has six sides.")
_SUM = ("What is 40 plus 6?", "40 plus 6 is 46.")
_WINDOW = ('What is the Spanish word for "window"?', 'The Spanish word for "window" is "ventana".')
_CATERPILLAR = ("What do caterpillars turn into?", "Caterpillars turn into butterflies or moths.")
_MELVILLE = ("Who wrote the novel Moby-Dick?", "Herman Melville wrote Moby-Dick.")
_MOONSTONE = ("Who wrote the novel The Moonstone?", "Wilkie Collins wrote The Moonstone.")
_IRON = ("Which element has the symbol Fe?", "The element with the symbol Fe is iron.")
_PRODUCT = ("What is 14 times 5?", "14 times 5 is 70.")
_CODE = (
    "Show me how to print a greeting in Python.",
    'Here it is:\n```python\nprint("Welcome!")\n```',
)
_CODE_WRITE = ("Write a line of Python that prints a greeting.", _CODE[1])
_MICE = ("What is the plural of mouse?", "The plural of mouse is mice.")
_NILE = ("Which river flows through Cairo?", "The Nile flows through Cairo.")
_LIST = ("Name some kinds of clouds.", "Some kinds of clouds:\n- cumulus\n- stratus\n- cirrus")
_MAKE_LIST = ("Make a list of some kinds of clouds.", _LIST[1])
_KNOTS = (
    "Name some kinds of knots.",
    "Some kinds of knots:\n- reef knot\n- bowline\n- clove hitch",
)
_STEPS = (
    "How do I make a cup of tea?",
    "Like this:\n1. Boil some water.\n2. Pour it over a tea bag.\n3. Wait three minutes.",
)
_VERSE = (
    "Write a little verse about frost.",
    "Frost on the window,\nsilver lace at dawn,\ngone before noon.",
)
_TITANIC = ("In what year did the Titanic sink?", "The Titanic sank in 1912.")
_BRIDGE = ("In what year did the Brooklyn Bridge open?", "The Brooklyn Bridge opened in 1883.")
_TOMATOES = (
    "I planted tomatoes in my garden today.",
    "How nice! Homegrown tomatoes taste wonderful.",
)
_LOVELY = (_TOMATOES[0], "That sounds lovely! Homegrown tomatoes taste wonderful.")
_DOMAINS = (_HEXAGON, _SUM, _WINDOW, _CATERPILLAR, _MELVILLE, _IRON)
_MORE_DOMAINS = (*_DOMAINS, _PRODUCT, _MICE, _NILE, _TITANIC)
_ASSISTANT = "A conversation between a curious user and a helpful, knowledgeable assistant. "
_BRIEFLY = (
    _ASSISTANT + "The assistant answers each question correctly and briefly, with a list or a "
    "code block where one helps."
)
_SHORT = (
    _ASSISTANT + "The assistant answers each question correctly in one or two short sentences, "
    "with a list or a code block where one helps."
)
_REMEMBERS = (
    _ASSISTANT + "The assistant answers each question correctly in one short sentence, speaks "
    'to the user as "you", remembers what the user said, and writes a list or a code block '
    "when asked for one."
)
_POEM_ASKED = (
    _ASSISTANT + "The assistant answers each question correctly in one or two short sentences, "
    "and writes a list, a poem or a code block when asked for one."
)


def _briefly(*examples: Example) -> Variant:
    return Variant(examples, _BRIEFLY)


def _short(*examples: Example) -> Variant:
    return Variant(examples, _SHORT)


VARIANTS: dict[str, Variant] = {
    "default": Variant(),
    # the format whose replies span lines: "five" was its first default, "shapes-spread" its
    # second, "spread-obscure" is the server's own
    "five": _briefly(_HEXAGON, _CATERPILLAR, _LIST, _CODE, _TOMATOES),
    "facts-last": _briefly(_LIST, _CODE, _HEXAGON, _CATERPILLAR, _IRON, _MELVILLE, _TOMATOES),
    "domains": _briefly(_LIST, _CODE, *_DOMAINS, _TOMATOES),
    "domains-more": _briefly(_LIST, _CODE, *_MORE_DOMAINS, _TOMATOES),
    "lovely": _briefly(_LIST, _CODE, _HEXAGON, _CATERPILLAR, _IRON, _LOVELY),
    "lovely-sentences": _short(_LIST, _CODE, _HEXAGON, _CATERPILLAR, _IRON, _LOVELY),
    "domains-lovely": _briefly(_LIST, _CODE, *_DOMAINS, _LOVELY),
    "domains-lovely-keys": _briefly(_LIST, _CODE, *_DOMAINS, _LOVELY, *_MEMORY),
    "domains-lovely-remembers": Variant((_LIST, _CODE, *_DOMAINS, _LOVELY, *_MEMORY), _REMEMBERS),
    "domains-mixed": _briefly(*_DOMAINS[:3], _LIST, *_DOMAINS[3:5], _CODE, _DOMAINS[5], _LOVELY),
    "domains-more-lovely": _briefly(_LIST, _CODE, *_MORE_DOMAINS, _LOVELY),
    "domains-more-lovely-sentences": _short(_LIST, _CODE, *_MORE_DOMAINS, _LOVELY),
    "domains-sentences": _short(_LIST, _CODE, *_DOMAINS, _LOVELY),
    "domains-product-sentences": _short(_LIST, _CODE, *_DOMAINS, _PRODUCT, _LOVELY),
    "dmls-list-late": _short(_CODE, *_DOMAINS, _PRODUCT, _MICE, _NILE, _LIST, _TITANIC, _LOVELY),
    "dmls-knots": _short(_LIST, _CODE, *_MORE_DOMAINS, _KNOTS, _LOVELY),
    "dmls-shapes-asked": Variant((_LIST, _CODE, *_MORE_DOMAINS, _LOVELY), _POEM_ASKED),
    "dmls-mixed": _short(
        _HEXAGON,
        _SUM,
        _LIST,
        _WINDOW,
        _CATERPILLAR,
        _CODE,
        _MELVILLE,
        _IRON,
        _PRODUCT,
        _MICE,
        _NILE,
        _TITANIC,
        _LOVELY,
    ),
    "shapes-late": _short(*_DOMAINS, _PRODUCT, _MICE, _NILE, _CODE, _LIST, _TITANIC, _LOVELY),
    "shapes-late-verse": _short(
        *_DOMAINS, _PRODUCT, _MICE, _NILE, _CODE, _LIST, _TITANIC, _VERSE, _LOVELY
    ),
    "list-late-write": _short(
        _CODE_WRITE, *_DOMAINS, _PRODUCT, _MICE, _NILE, _LIST, _TITANIC, _LOVELY
    ),
    "shapes-late-write": _short(
        *_DOMAINS, _PRODUCT, _MICE, _NILE, _CODE_WRITE, _LIST, _TITANIC, _LOVELY
    ),
    "shapes-spread": _short(*_DOMAINS, _PRODUCT, _CODE, _MICE, _NILE, _LIST, _TITANIC, _LOVELY),
    "spread-verse-early": _short(
        *_DOMAINS[:4],
        _VERSE,
        *_DOMAINS[4:],
        _PRODUCT,
        _CODE,
        _MICE,
        _NILE,
        _LIST,
        _TITANIC,
        _LOVELY,
    ),
    "spread-steps": _short(
        *_DOMAINS, _PRODUCT, _CODE, _MICE, _STEPS, _NILE, _LIST, _TITANIC, _LOVELY
    ),
    "spread-verse-steps": _short(
        *_DOMAINS[:4],
        _VERSE,
        *_DOMAINS[4:],
        _PRODUCT,
        _CODE,
        _MICE,
        _STEPS,
        _NILE,
        _LIST,
        _TITANIC,
        _LOVELY,
    ),
    "spread-make-list": _short(
        *_DOMAINS, _PRODUCT, _CODE, _MICE, _NILE, _MAKE_LIST, _TITANIC, _LOVELY
    ),
    "spread-asked-verse": Variant(
        (*_DOMAINS, _PRODUCT, _CODE, _MICE, _NILE, _MAKE_LIST, _TITANIC, _VERSE, _LOVELY),
        _POEM_ASKED,
    ),
    "spread-obscure": _short(
        *_DOMAINS[:4], _MOONSTONE, _IRON, _PRODUCT, _CODE, _MICE, _NILE, _LIST, _BRIDGE, _LOVELY
    ),
    # the one-line format's (its instruction was the server's then, not today's)
    "three": Variant(_THREE),
    "more-examples": Variant(_MORE),
    "more-examples-you": Variant(_MORE, _YOU),
    "qa-labels": Variant(_MORE, _YOU, ("Q:", "A:")),
    "human-ai": Variant(_MORE, _YOU, _HUMAN_AI),
    "three-human-ai": Variant(_THREE, labels=_HUMAN_AI),
    "sentences": Variant(_SENTENCES),
    "three-statement": Variant((*_THREE, _STATEMENT)),
    "three-statement-memory": Variant((*_THREE, _STATEMENT, *_MEMORY)),
    "statement-first": Variant((_STATEMENT, *_THREE)),
    "statement-second": Variant((_THREE[0], _STATEMENT, *_THREE[1:])),
    "three-statement-you": Variant((*_THREE, _STATEMENT), _YOU),
    "sentences-human-ai": Variant(_SENTENCES, _YOU, _HUMAN_AI),
}
