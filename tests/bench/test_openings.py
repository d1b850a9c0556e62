"""The openings scenario's pure parts: the medians its rounds add up to, the ratio, its table."""

from __future__ import annotations

from bench import openings, render


def samples() -> dict[str, dict[int, list[tuple[float, int, int]]]]:
    return {
        "shared": {8: [(0.1, 121, 112), (0.2, 122, 112), (0.3, 121, 112)], 1: [(0.05, 121, 112)]},
        "unshared": {8: [(0.4, 121, 0), (0.5, 122, 0), (0.9, 121, 0)], 1: [(0.1, 121, 0)]},
    }


def test_the_summary_sets_each_modes_median_ttft_against_the_other() -> None:
    result = openings.summary(samples())
    shared, unshared = result["modes"]["shared"]["8"], result["modes"]["unshared"]["8"]
    assert (shared["ttft_median_s"], unshared["ttft_median_s"]) == (0.2, 0.5)
    assert (shared["cached_tokens"], unshared["cached_tokens"]) == ([112], [0])
    assert shared["prompt_tokens"] == [121, 122] and shared["streams"] == 3
    assert result["shared_over_unshared"] == {"8": 0.2 / 0.5, "1": 0.5}


def test_the_table_and_targets_name_the_ratio_per_concurrency() -> None:
    result = {"workload": {"rounds": 6}, "engine": "batched", **openings.summary(samples())}
    text = render.text(openings.report(result))
    assert "8 at once: shared TTFT 200 ms (cached_tokens [112] of [121, 122])" in text
    assert "shared / unshared 0.40" in text
    met = {row.target.split(",")[0]: row.met for row in openings.targets(result)}
    assert met == {"8 first prompts at once": True, "1 first prompts at once": True}
