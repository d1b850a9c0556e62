"""The reply rules every engine shares: its token budget, the texts that end it, why it ended,
and what its ``Finished`` carries."""

from __future__ import annotations

import pytest
from wschat.protocol import FinishReason, Usage
from wschat.server.engine import Finished
from wschat.server.engine.stopping import (
    StopTexts,
    completed,
    final_reason,
    finish_reason,
    token_budget,
)

LABELS = ("User:", "Assistant:")


@pytest.mark.parametrize(
    ("asked", "prompt", "budget"),
    [(100, 50, 100), (100, 8150, 42), (100, 8192, 1), (100, 9000, 1), (0, 10, 1)],
)
def test_the_budget_is_what_was_asked_within_the_room_left_and_at_least_one(
    asked: int, prompt: int, budget: int
) -> None:
    assert token_budget(asked, 8192, prompt) == budget


def test_a_cancel_comes_before_a_stop_and_a_stop_before_the_length() -> None:
    assert finish_reason(cancelled=True, stopped=True, produced=5, budget=5) is (
        FinishReason.CANCELLED
    )
    assert finish_reason(cancelled=False, stopped=True, produced=5, budget=5) is FinishReason.STOP
    assert finish_reason(cancelled=False, stopped=False, produced=5, budget=5) is (
        FinishReason.LENGTH
    )
    assert finish_reason(cancelled=False, stopped=False, produced=4, budget=5) is None


def test_a_reply_its_producer_ended_unstopped_ended_at_a_length_limit() -> None:
    assert final_reason(cancelled=False, stopped=False) is FinishReason.LENGTH
    assert final_reason(cancelled=False, stopped=True) is FinishReason.STOP
    assert final_reason(cancelled=True, stopped=True) is FinishReason.CANCELLED


def test_a_finished_reply_carries_its_text_and_usage_unless_its_producer_counted_it() -> None:
    end = Finished(FinishReason.STOP, completion_ids=(5, 6))
    counts = {"prompt_tokens": 12, "completion_tokens": 2, "cached_tokens": 4}
    done = completed(end, text="Hi.", **counts)
    assert (done.reason, done.completion_ids, done.text) == (FinishReason.STOP, (5, 6), "Hi.")
    assert done.usage == Usage(12, 2, 4)
    own = Usage(12, 3, 0)  # a producer that counted its reply itself (one token not streamed)
    assert completed(Finished(FinishReason.LENGTH, usage=own), text="", **counts).usage == own


def shown(
    pieces: list[str], stops: tuple[str, ...] = (), labels: tuple[str, ...] = LABELS
) -> list[str]:
    """What each piece lets through (and, where none stopped it, what the end lets through)."""
    texts = StopTexts(stops, labels)
    out = [texts.feed(piece) for piece in pieces]
    return out if texts.hit else [*out, texts.flush()]


def test_a_turn_label_at_a_line_start_ends_the_reply_before_its_line_breaks() -> None:
    assert shown([" Paris", ".", "\n\n", "User", ":", " Hi"]) == [" Paris", ".", "", "", "", ""]
    assert shown(["a", "\n", "Assistant", ":"]) == ["a", "", "", ""]


def test_line_breaks_are_held_until_the_next_text_shows_no_label_starts_there() -> None:
    assert shown(["- red", "\n", "- blue", "\n", "Us", "ed"]) == [
        "- red", "", "\n- blue", "", "", "\nUsed", "",
    ]  # fmt: skip


def test_a_reply_shows_no_line_break_it_starts_or_ends_with_but_a_label_start_it_ended_on() -> None:
    assert shown(["\n", "Red", "\n", "\n"]) == ["", "Red", "", "", ""]
    assert shown(["Red", "\n", "Use"]) == ["Red", "", "", "\nUse"]


def test_a_reply_that_begins_with_the_next_turn_is_empty() -> None:
    assert shown(["\n", "User", ":"]) == ["", "", ""]


def test_a_label_inside_a_line_is_text() -> None:
    assert shown(["Say User: hi"]) == ["Say User: hi", ""]


def test_a_stop_string_is_cut_anywhere_and_its_start_held_until_decided() -> None:
    assert shown(["x st", "op y"], stops=("stop",), labels=()) == ["x ", ""]
    assert shown(["x st", "ap y"], stops=("stop",), labels=()) == ["x ", "stap y", ""]
    assert shown(["a\n", "\n"], labels=()) == ["a\n", "\n", ""]  # no labels: breaks are text
