"""``ThreadPolicy``: the thread count torch uses inside an engine's worker, fixed or following
the cores other processes keep busy; ``OthersLoad`` read from a ``/proc/stat`` of our own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from wschat.server.engine import GenerationRequest, SamplingParams
from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.loader import LoadedModel
from wschat.server.engine.local.threads import (
    FIRST_WINDOW_S,
    SAMPLE_INTERVAL_S,
    OthersLoad,
    ThreadPolicy,
    threads_for,
)

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


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Readings:
    """The others' load a policy reads, one value per reading."""

    def __init__(self, *values: float | None) -> None:
        self.values = list(values)
        self.reads = 0

    def __call__(self) -> float | None:
        self.reads += 1
        return self.values.pop(0)


@pytest.mark.parametrize(
    ("others", "cores", "threads"),
    [(0.0, 2, 2), (0.3, 2, 2), (0.4, 2, 1), (1.0, 2, 1), (3.5, 2, 1), (1.0, 8, 7), (0.0, 1, 1)],
)
def test_threads_for_leaves_one_core_out_per_core_others_keep_busy(
    others: float, cores: int, threads: int
) -> None:
    assert threads_for(others, cores) == threads


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


def write_stat(path: Path, cpu0: int, cpu1: int, cpu2: int) -> None:
    """A /proc/stat with its busy ticks (user) per CPU, plus idle and iowait that never count."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    lines += [f"cpu{n} {busy} 0 0 5000 70 0 0 0 0 0" for n, busy in enumerate((cpu0, cpu1, cpu2))]
    path.write_text("\n".join([*lines, "intr 1 2 3", ""]))


def others_load(tmp_path: Path, own: list[float], clock: Clock) -> Callable[[], float | None]:
    stat = tmp_path / "stat"
    write_stat(stat, 1000, 1000, 1000)
    return OthersLoad({0, 1}, stat=stat, own_cpu_s=lambda: own[0], clock=clock).sample


def test_others_load_is_our_cpus_busy_time_less_our_own(tmp_path: Path) -> None:
    clock, own = Clock(), [3.0]
    sample = others_load(tmp_path, own, clock)
    ticks = 100  # SC_CLK_TCK on Linux
    # in 0.5 s: cpu0 +40 ticks, cpu1 +50 ticks, cpu2 (not ours) +50; we used 0.3 s of them
    write_stat(tmp_path / "stat", 1040, 1050, 1050)
    own[0], clock.now = 3.3, clock.now + 0.5
    assert sample() == pytest.approx((0.9 - 0.3) / 0.5 * 100 / ticks)


def test_others_load_says_nothing_after_a_long_idle_window(tmp_path: Path) -> None:
    clock, own = Clock(), [0.0]
    sample = others_load(tmp_path, own, clock)
    clock.now += 60
    assert sample() is None
    clock.now += 0.5  # the next reading starts from the idle one
    assert sample() == 0.0


def test_others_load_cannot_be_read_without_proc_stat(tmp_path: Path) -> None:
    load = OthersLoad({0}, stat=tmp_path / "missing")
    assert not load.readable
    assert load.sample() is None
