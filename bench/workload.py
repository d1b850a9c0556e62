"""What every run measures: the prompts, lengths and counts, full or ``--quick``."""

from __future__ import annotations

from dataclasses import dataclass

SUBJECTS = (
    "a lighthouse keeper who finds a map",
    "a robot learning to paint",
    "two rival bakers in a small town",
    "a dragon afraid of heights",
    "the last train across a frozen lake",
    "a detective who cannot remember faces",
    "a garden that grows overnight",
    "an astronaut's first day back on Earth",
)


def story(i: int) -> str:
    return f"Write a long, detailed story about {SUBJECTS[i % len(SUBJECTS)]}."


CONVERSATION = (
    "Tell me about the history of the bicycle.",
    "Who improved it next?",
    "What changed with pneumatic tyres?",
    "How did bicycles change cities?",
    "And women's lives?",
    "What about racing?",
    "Which materials are used now?",
    "How do electric bicycles work?",
    "What will bicycles look like in 2050?",
    "Summarize what we talked about.",
)


@dataclass(frozen=True, slots=True)
class Workload:
    tokens: int = 64  # new tokens per stream
    concurrency: tuple[int, ...] = (1, 4, 8)
    repeats: int = 4  # rounds of every concurrency, each system measured back to back
    turn_tokens: int = 100  # reply length of each conversation turn
    conversations: int = 5  # turn 10 against turn 1: the median over these runs of their ratio
    arrival_rounds: int = 3  # of the staggered arrivals (bench/arrivals.py)
    cancels: int = 20
    idle_sessions: int = 1000
    peer_concurrency: tuple[int, ...] = (1, 4, 8)
    other_engines: tuple[str, ...] = ("generate",)

    @classmethod
    def quick(cls) -> Workload:
        return cls(
            tokens=32,
            repeats=1,
            turn_tokens=30,
            conversations=3,
            arrival_rounds=1,
            cancels=8,
            idle_sessions=300,
            peer_concurrency=(8,),
            other_engines=(),
        )

    def texts(self, n: int) -> list[str]:
        return [story(i) for i in range(n)]
