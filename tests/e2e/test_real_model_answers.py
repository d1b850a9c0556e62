"""The embedded Gemma 3 270M (a pretrained base model) answers plain questions in its default
prompt format: greedy, most replies name the expected word, none loops, each ends on its own."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from tests.support import raw_peer, running_server

pytestmark = pytest.mark.real_model

# Held out: none of these is one of the transcript format's examples.
QUESTIONS = [
    ("What is the capital of France?", "Paris"),
    ("What is the largest planet in our solar system?", "Jupiter"),
    ("Who wrote Romeo and Juliet?", "Shakespeare"),
    ("What color is the sky on a clear day?", "blue"),
    ("What is the boiling point of water in Celsius?", "100"),
    ("Which ocean is the largest?", "Pacific"),
    ("What do bees make?", "honey"),
    ("What is the opposite of hot?", "cold"),
]
LIMIT = 64


def embedded_engine() -> Any:
    from wschat.server.engine.local.batched import BatchedEngine
    from wschat.server.engine.local.loader import load_model

    return BatchedEngine(load_model("embedded"))


def loops(text: str) -> bool:
    """A repeated line, or any run of 4 words that comes back."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    words = re.findall(r"\w+", text.lower())
    runs = [tuple(words[i : i + 4]) for i in range(len(words) - 3)]
    return len(set(lines)) < len(lines) or len(set(runs)) < len(runs)


def test_loops_spots_a_repeated_line_and_a_repeated_four_word_run() -> None:
    assert loops("Paris.\nParis.")
    assert loops("The capital of France is the capital of France is")
    assert not loops("The capital of France is Paris.")


async def test_embedded_model_answers_plain_questions_and_ends_its_replies() -> None:
    async with asyncio.timeout(600):  # converts the GGUF on first use (about a minute)
        engine = await asyncio.to_thread(embedded_engine)
    replies: list[tuple[str, str, str]] = []
    try:
        async with running_server(engine) as url, raw_peer(url) as (peer, ready):
            assert ready["prompt_format"] == "transcript"
            for n, (question, _) in enumerate(QUESTIONS):
                # each question on its own, as a new user would ask it
                await peer.send({"type": "reset"})
                await peer.recv_until("reset_ok")
                await peer.send(
                    {
                        "type": "prompt",
                        "id": f"q{n}",
                        "text": question,
                        "params": {"max_new_tokens": LIMIT},
                    }
                )
                done = (await peer.recv_until("done", timeout=300))[-1]
                replies.append((question, done["text"], done["reason"]))
    finally:
        await engine.aclose()
    for question, text, reason in replies:  # printed with -s: the closing note quotes them
        print(f"{question!r} -> {text!r} ({reason})")
    named = [
        want.lower() in text.lower()
        for (_, want), (_, text, _) in zip(QUESTIONS, replies, strict=True)
    ]
    assert sum(named) >= 6, replies
    assert [r for r in replies if loops(r[1])] == []
    assert [r for r in replies if r[2] != "stop"] == []  # each ended before the limit
    assert all(r[1] and r[1] == r[1].strip() and "\n" not in r[1] for r in replies), replies
