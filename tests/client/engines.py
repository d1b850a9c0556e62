"""Scripted engines the client tests run against."""

from __future__ import annotations

from wschat.server.engine import GenerationRequest

from tests.fakes.scripted import Script, ScriptedEngine

WAIT = 10.0  # seconds any single await in these tests may take


def slow_engine(delay_s: float = 0.02, limit: int = 400, **kwargs: object) -> ScriptedEngine:
    """Replies of ``min(max_new_tokens, limit)`` words, one every ``delay_s``: long enough to be
    cancelled, reset or pinged mid-stream; a small ``max_new_tokens`` makes a quick one."""

    def script(request: GenerationRequest) -> Script:
        n = min(request.params.max_new_tokens, limit)
        return Script([f" s{i}" for i in range(n)], delay_s=delay_s, end_with_eos=False)

    return ScriptedEngine(script, **kwargs)  # type: ignore[arg-type]


def failing_engine(after: int = 2) -> ScriptedEngine:
    return ScriptedEngine(lambda request: Script([" a", " b", " c", " d"], fail_after=after))


def is_sublist(part: list[int], whole: list[int]) -> bool:
    return any(whole[i : i + len(part)] == part for i in range(len(whole) - len(part) + 1))
