"""``Ticker``: a log line every interval while a long step runs, and none once it ends."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from wschat.server.engine.local.ticker import Ticker

from tests.support import TIMEOUT


class Lines(logging.Handler):
    """The messages logged, and a way to wait for the n-th."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []
        self._added = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self._added:
            self.messages.append(record.getMessage())
            self._added.notify_all()

    def wait_for(self, count: int) -> list[str]:
        with self._added:
            assert self._added.wait_for(lambda: len(self.messages) >= count, TIMEOUT)
            return list(self.messages)


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    log = logging.getLogger("tests.ticker")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    yield handler
    log.removeHandler(handler)


def test_ticker_logs_the_running_step_every_interval_until_the_step_ends(lines: Lines) -> None:
    log = logging.getLogger("tests.ticker")
    with Ticker(log, "reading the tokenizer", interval_s=0.01) as ticker:
        first = lines.wait_for(2)
        ticker.step = "dequantizing the weights"
        seen = len(lines.wait_for(len(first) + 1))
        latest = lines.wait_for(seen + 1)[-1]
    assert all(m.startswith("  ... reading the tokenizer (") for m in first[:2])
    assert latest.startswith("  ... dequantizing the weights (") and latest.endswith(" s)")
    assert not ticker.thread.is_alive()  # joined: nothing more can be logged


def test_ticker_stops_when_the_step_raises(lines: Lines) -> None:
    ticker = Ticker(logging.getLogger("tests.ticker"), "saving", interval_s=0.01)
    with pytest.raises(RuntimeError, match="conversion failed"), ticker:
        lines.wait_for(1)
        raise RuntimeError("conversion failed")
    assert not ticker.thread.is_alive()


def test_a_step_shorter_than_the_interval_logs_nothing_and_ends_without_waiting_for_it(
    lines: Lines,
) -> None:
    with Ticker(logging.getLogger("tests.ticker"), "assembling", interval_s=3600) as ticker:
        pass
    assert (lines.messages, ticker.thread.is_alive()) == ([], False)
