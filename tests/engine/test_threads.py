"""``ThreadPolicy``: the thread count torch uses inside an engine's worker, fixed or following
the cores other processes keep busy (``engine/cores.py``, tests/engine/test_cores.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch
from wschat.server.engine import GenerationRequest, SamplingParams
from wschat.server.engine.cores import SAMPLE_INTERVAL_S
from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.loader import LoadedModel
from wschat.server.engine.local.threads import FIRST_WINDOW_S, ThreadPolicy

from tests.engine.test_cores import Clock
from tests.support import collect


@pytest.fixture(autouse=True)
def torch_threads_restored() -> Iterator[None]:
    """A worker's set_num_threads also sets the count later threads start with: put it back."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def in_a_worker(policy: ThreadPolicy) -> tuple[int, int]:
    """``policy.apply()`` in a fresh thread: what it returned and what torch then said there."""
    seen: list[int] = []

    def work() -> None:
        seen.append(policy.apply())
        seen.append(torch.get_num_threads())

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(10)
    return seen[0], seen[1]


class Readings:
    """The others' load a policy reads, one value per reading."""

    def __init__(self, *values: float | None) -> None:
        self.values = list(values)
        self.reads = 0

    def __call__(self) -> float | None:
        self.reads += 1
        return self.values.pop(0)


@pytest.mark.parametrize("count", [0, -1])
def test_a_fixed_count_below_one_is_refused(count: int) -> None:
    with pytest.raises(ValueError, match=f"threads must be 1 or more, got {count}"):
        ThreadPolicy(count)


def test_a_fixed_count_holds_in_the_worker_whatever_the_load() -> None:
    readings = Readings(2.0)
    policy = ThreadPolicy(3, cores=2, load=readings)
    assert in_a_worker(policy) == (3, 3)
    assert policy.in_worker == 3
    assert readings.reads == 0
    assert policy.reason == "3 (asked for with --threads / WSCHAT_THREADS)"


def test_auto_follows_the_load_read_every_interval() -> None:
    clock = Clock()
    policy = ThreadPolicy(cores=2, load=Readings(1.0, 0.0), clock=clock)
    assert policy.reason.startswith("auto: 2 (one per usable core) while the cores are free")
    assert in_a_worker(policy) == (1, 1)
    clock.now += SAMPLE_INTERVAL_S / 2
    assert in_a_worker(policy) == (1, 1)  # not read again before the interval
    clock.now += SAMPLE_INTERVAL_S / 2
    assert in_a_worker(policy) == (2, 2)
    assert policy.others == 0.0


def test_auto_keeps_its_count_when_a_reading_says_nothing() -> None:
    clock = Clock()
    readings = Readings(1.0, None, 0.0)
    policy = ThreadPolicy(cores=2, load=readings, clock=clock)
    assert in_a_worker(policy) == (1, 1)
    clock.now += SAMPLE_INTERVAL_S
    assert in_a_worker(policy) == (1, 1)
    clock.now += FIRST_WINDOW_S  # after a reading that said nothing, the next comes sooner
    assert in_a_worker(policy) == (2, 2)
    assert readings.reads == 3
    clock.now += FIRST_WINDOW_S
    assert in_a_worker(policy) == (2, 2)
    assert readings.reads == 3  # then a whole interval again


class RecordingPolicy(ThreadPolicy):
    """The real policy, noting what each ``apply`` gave; the neighbour leaves after 3 passes."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(cores=2, load=Readings(1.0, 0.0), clock=clock)
        self.clock = clock
        self.by_pass: list[int] = []

    def apply(self) -> int:
        self.by_pass.append(super().apply())
        if len(self.by_pass) == 3:
            self.clock.now += SAMPLE_INTERVAL_S
        return self.by_pass[-1]


async def test_the_batched_worker_applies_the_policy_on_every_pass(
    tiny_text_loaded: LoadedModel,
) -> None:
    policy = RecordingPolicy(Clock())
    engine = BatchedEngine(tiny_text_loaded, threads=policy)
    request = GenerationRequest([2, 10, 11, 12], SamplingParams(max_new_tokens=6), session_key="s")
    _, finished = await collect(engine.generate(request))
    await engine.aclose()
    assert finished.reason.value == "length"
    assert len(policy.by_pass) >= 5  # a pass per token (the prefill pass decodes one too)
    assert policy.by_pass[:3] == [1, 1, 1]
    assert set(policy.by_pass[3:]) == {2}
    assert policy.in_worker == 2
