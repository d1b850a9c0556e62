"""The rewind scenario's pure parts: the figures its rounds add up to and its table."""

from __future__ import annotations

from bench import render, rewind
from bench.rewind import Round


def round_of(edit_ttft: float, edit_cached: int, plain_ttft: float = 0.2) -> Round:
    return Round(
        conversation_tokens=400,
        edit_ttft=edit_ttft,
        edit_rewind=0.002,
        edit_prompt_tokens=90,
        edit_cached_tokens=edit_cached,
        plain_ttft=plain_ttft,
        plain_prompt_tokens=90,
        plain_cached_tokens=72,
        retype=3.0,
        turn_tokens=15,
    )


def test_the_summary_sets_the_median_edit_against_the_median_plain_turn() -> None:
    rounds = [round_of(0.2, 78), round_of(0.3, 78, 0.25), round_of(0.22, 78, 0.2)]
    result = rewind.summary(rounds)
    assert result["edit_ttft_median_s"] == 0.22 and result["plain_ttft_median_s"] == 0.2
    assert result["edit_over_plain"] == 0.22 / 0.2
    assert result["kept_tokens"] == 75 and result["reused_kept_turns"]
    assert result["edit_cached_tokens"] == [78, 78, 78]


def test_an_edit_that_prefilled_the_whole_prompt_did_not_reuse_the_kept_turns() -> None:
    result = rewind.summary([round_of(0.9, 78), round_of(0.9, 0)])
    assert not result["reused_kept_turns"]
    work = {"workload": {"turns": 10}, "engine": "batched"}
    text = render.text(rewind.report({**work, "configs": [{"reply_tokens": 100, **result}]}))
    assert "cached_tokens [78, 0] (turns 1-2: 75)" in text
    assert "  edit / plain: 4.50" in text.splitlines()
    missed = [line for line in text.splitlines() if line.startswith("rewind, 100-token")]
    assert missed == [
        "rewind, 100-token replies: edit TTFT <= 1.2 x plain                 900 ms      200 ms"
        "      4.500x  NO"
    ]
