"""The choices scenario's pure parts: the counters read from /metrics, its target and report."""

from __future__ import annotations

from bench import choices

METRICS = """# HELP wschat_prompt_tokens_total Prompt tokens processed.
# TYPE wschat_prompt_tokens_total counter
wschat_prompt_tokens_total 164.0
# TYPE wschat_cached_prompt_tokens_total counter
wschat_cached_prompt_tokens_total 123.0
wschat_generation_tokens_total 12.0
"""


def test_the_counters_are_read_from_the_metrics_text() -> None:
    found = dict(choices.COUNTERS.findall(METRICS))
    assert found == {"wschat_prompt_tokens": "164.0", "wschat_cached_prompt_tokens": "123.0"}


def test_the_target_and_report_name_the_ratio_and_what_was_prefilled() -> None:
    result = {
        "workload": {"rounds": 4, "n": 4, "tokens": 48},
        "engine": "batched",
        "choices_tokens_per_s": 40.0,
        "requests_tokens_per_s": 42.0,
        "ratio": 40.0 / 42.0,
        "prefilled_tokens": [41, 41],
        "prompt_tokens": [41, 41],
    }
    (target,) = choices.targets(result)
    assert target.met is True and target.limit == 0.9
    text = "\n".join(str(part) for part in choices.report(result).parts)
    assert "(0.95x); prompt tokens prefilled per request with n [41, 41] of" in text
