"""The plain-question scorer's checks, on replies of our own (no model)."""

from __future__ import annotations

import re

from wschat.server.engine.formats import TRANSCRIPT_EXAMPLES

from bench import answers
from bench.answer_variants import VARIANTS
from bench.answers import Item, echoes, judge


def test_a_number_passes_as_digits_or_words_and_an_echo_of_the_question_fails() -> None:
    item = Item(
        "arithmetic",
        ("What is 17 times 23?",),
        any=(r"\b391\b", "three hundred (and )?ninety[- ]one"),
    )
    assert judge(item, "17 times 23 is 391.")
    assert judge(item, "Three hundred and ninety-one.")
    assert not judge(item, "17 times 23 is 17 times 23.")
    assert not judge(item, "It is 3910.")


def test_a_list_needs_every_member_and_at_least_counts_distinct_matches() -> None:
    colors = Item("lists", ("Name the three primary colors.",), all=("red", "blue", "yellow"))
    assert judge(colors, "Red, Blue and yellow.")
    assert not judge(colors, "Red, blue, and green.")
    fruits = Item("lists", ("Name three fruits.",), at_least=(3, ("apples?", "pears?", "plums?")))
    assert judge(fruits, "An apple, a pear and plums.")
    assert not judge(fruits, "Apples, apples and pears.")


def test_a_forbidden_match_fails_a_reply_that_also_has_the_answer() -> None:
    item = Item(
        "facts", ("How many days are in a leap year?",), any=(r"\b366\b",), none=(r"\b365\b",)
    )
    assert judge(item, "A leap year has 366 days.")
    assert not judge(item, "365 or 366 days.")


def test_a_reply_that_repeats_five_words_of_the_statement_in_a_row_echoes_it() -> None:
    said = "I am learning to play the guitar."
    assert echoes(said, "I am learning to play the guitar.")
    assert echoes(said, "You are learning to play the guitar!")
    assert not echoes(said, "That's great! How long have you played?")
    item = Item("statements", (said,), no_echo=True)
    assert not judge(item, "I am learning to play the guitar.")
    assert judge(item, "How exciting! Which songs do you like?")
    assert not judge(item, "  ")


def test_a_follow_up_judges_the_reply_to_its_last_turn() -> None:
    item = Item("follow-ups", ("My name is Anna.", "What is my name?"), any=(r"\banna\b",))
    replies = [["Nice to meet you.", "Your name is Anna."], ["My name is Anna.", "I am Bob."]]
    tally = answers.tally([item, item], replies)
    assert tally.total() == (1, 2)
    assert tally.line() == "1/2 (follow-ups 1/2)"


def test_the_question_file_has_forty_questions_of_every_kind_a_holdout_and_the_old_set() -> None:
    sets = answers.load()
    kinds = {item.kind for item in sets["new"]}
    assert {"facts", "arithmetic", "translation", "lists", "follow-ups"} <= kinds
    assert sum(item.kind != "statements" for item in sets["new"]) >= 40
    assert len(sets["old"]) == 8 and len(sets["holdout"]) >= 20
    assert len(sets["shapes"]) == 10
    assert {item.kind for item in sets["shapes"]} == {"list", "code", "poem"}
    for item in [item for name in answers.SETS for item in sets[name]]:
        assert item.any or item.all or item.at_least or item.no_echo or item.shape, item
        for pattern in (*item.any, *item.all, *item.none, *(item.at_least or (0, ()))[1]):
            re.compile(pattern)
        assert all(text == text.strip() and text for text in item.turns)


def test_neither_the_format_nor_a_variant_shows_the_model_a_question_of_the_set() -> None:
    sets = answers.load()
    asked = {_plain(t) for name in answers.SETS for item in sets[name] for t in item.turns}
    shown = {"default": TRANSCRIPT_EXAMPLES} | {
        name: variant.examples for name, variant in VARIANTS.items()
    }
    for name, examples in shown.items():
        for question, _ in examples:
            assert _plain(question) not in asked, (name, question)


def test_the_formats_examples_share_no_question_and_give_no_answer_the_sets_accept() -> None:
    """What the default format shows the model is scored nowhere: no example is a question of a
    set or shares a run of four words with one, and no accepted answer is in an example."""
    sets = answers.load()
    items = [item for name in answers.SETS for item in sets[name]]
    for question, reply in TRANSCRIPT_EXAMPLES:
        shown = f"{question}\n{reply}"
        for item in items:
            for turn in item.turns:
                assert not answers.echoes(turn, question, 4), (question, turn)
            patterns = [*item.any, *item.all, *(item.at_least or (0, ()))[1]]
            assert not [p for p in patterns if re.search(p, shown, re.I)], (question, item)


def test_a_shape_is_a_list_a_code_block_or_several_lines() -> None:
    shaped = {
        "list": ("- bread\n- cheese", "1. Wet\n2) Soap"),
        "code": ("Here:\n```python\nprint(1)\n```", "```js\nconsole.log(1)"),
        "lines": ("Leaves fall,\nred and gold,\nthe wind is cold.",),
    }
    unshaped = {
        "list": ("Bread, cheese and grapes.", "- bread only"),
        "code": ("print(1)", "```python\n"),
        "lines": ("One line.\nTwo lines.",),
    }
    for shape, replies in shaped.items():
        item = Item(shape, ("Ask.",), shape=shape)
        assert all(judge(item, reply) for reply in replies), shape
        assert not any(judge(item, reply) for reply in unshaped[shape]), shape


def _plain(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))
