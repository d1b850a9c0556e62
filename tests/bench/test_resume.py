"""The mid-reply resume scenario's pure parts: what a drop must bring back to count as whole,
the latency figures, the target and the table."""

from __future__ import annotations

from typing import Any

from bench import render, resume
from bench.resume import Drop

REFERENCE = " a b c d e"


def token(text: str, index: int) -> dict[str, Any]:
    return {"type": "token", "id": "p", "text": text, "index": index}


def done(text: str = REFERENCE) -> dict[str, Any]:
    return {"type": "done", "id": "p", "text": text}


def drop(after: list[dict[str, Any]], latency: float = 0.05) -> Drop:
    return Drop([token(" a", 1), token(" b", 2)], after, latency, "p")


def test_a_drop_is_whole_when_before_and_after_make_the_reply_once_with_its_done() -> None:
    assert resume.whole(REFERENCE, drop([token(" c d", 4), token(" e", 5), done()]))


def test_a_gap_a_repeat_or_a_missing_done_is_not_whole() -> None:
    gap = drop([token(" d", 4), token(" e", 5), done()])
    repeat = drop([token(" b c d", 4), token(" e", 5), done()])
    repeated_index = drop([token(" c d", 2), token(" e", 5), done()])
    no_done = drop([token(" c d", 4), token(" e", 5)])
    other_done = drop([token(" c d", 4), token(" e", 5), done(" a b")])
    for broken in (gap, repeat, repeated_index, no_done, other_done):
        assert not resume.whole(REFERENCE, broken)


def test_the_summary_has_the_latency_median_and_p95_and_names_the_broken_drops() -> None:
    whole = [drop([token(" c d e", 5), done()], latency=ms / 1000) for ms in range(10, 30)]
    broken = drop([token(" x", 3), done()], latency=0.5)
    result = resume.summary(REFERENCE, [*whole, broken])
    assert (result["drops"], result["whole"], result["broken"]) == (21, 20, [20])
    assert result["latency_median_s"] == 0.02
    assert result["latency_p95_s"] == 0.029
    assert result["resumed_reply"] == 21


def test_the_target_is_met_only_when_every_drop_is_whole_and_the_table_says_so() -> None:
    result = {
        "workload": {"drops": 2, "tokens": 128, "after": 4},
        "engine": "batched",
        **resume.summary(REFERENCE, [drop([token(" c d e", 5), done()]), drop([done()])]),
    }
    (row,) = resume.targets(result)
    assert (row.value, row.against, row.met) == (1, 2, False)
    text = render.text(resume.report(result))
    assert "median 50 ms, p95 50 ms" in text
    assert "whole replies (before + after == uninterrupted, indices rising): 1 of 2" in text
    assert "resume: every dropped reply resumed whole, none repeated" in text
