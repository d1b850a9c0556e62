"""The cores an engine may size its threads to (``engine/cores.py``), torch-free: the usable ones,
the ones other processes keep busy (``OthersLoad`` read from a ``/proc/stat`` of our own), and
the count ``auto`` picks."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from wschat.server.engine.cores import (
    OthersLoad,
    cgroup_cpu_limit,
    threads_for,
    threads_now,
    usable_cores,
)


@pytest.mark.parametrize(
    ("text", "cores"),
    [("150000 100000\n", 2), ("100000 100000\n", 1), ("50000 100000\n", 1), ("max 100000\n", None)],
)
def test_a_cgroup_cpu_quota_is_whole_cores_rounded_up(
    tmp_path: Path, text: str, cores: int | None
) -> None:
    (tmp_path / "cpu.max").write_text(text)
    assert cgroup_cpu_limit(tmp_path / "cpu.max") == cores


def test_no_cgroup_file_is_no_limit(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path / "absent") is None


def test_the_usable_cores_are_those_this_process_may_run_on() -> None:
    assert 1 <= usable_cores() <= len(os.sched_getaffinity(0))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("others", "cores", "threads"),
    [(0.0, 2, 2), (0.3, 2, 2), (0.4, 2, 1), (1.0, 2, 1), (3.5, 2, 1), (1.0, 8, 7), (0.0, 1, 1)],
)
def test_threads_for_leaves_one_core_out_per_core_others_keep_busy(
    others: float, cores: int, threads: int
) -> None:
    assert threads_for(others, cores) == threads


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


def test_threads_now_leaves_out_the_cores_others_kept_busy_over_its_window(
    tmp_path: Path,
) -> None:
    clock, stat = Clock(), tmp_path / "stat"
    write_stat(stat, 1000, 1000, 1000)
    load = OthersLoad({0, 1}, stat=stat, own_cpu_s=lambda: 0.0, clock=clock)

    def neighbour_busy_for(seconds: float) -> None:  # the window passes; cpu1 was busy all along
        write_stat(stat, 1000, 1000 + round(seconds * 100), 1000)
        clock.now += seconds

    assert threads_now(2, window_s=0.5, load=load, sleep=neighbour_busy_for) == (1, 1.0)


def test_threads_now_takes_every_core_where_no_load_can_be_read(tmp_path: Path) -> None:
    load = OthersLoad({0}, stat=tmp_path / "missing")
    assert threads_now(3, load=load, sleep=lambda s: pytest.fail("no window to wait")) == (3, None)
