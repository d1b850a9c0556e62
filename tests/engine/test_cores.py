"""The cores an engine may size its threads to (``engine/cores.py``), torch-free."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from wschat.server.engine.cores import cgroup_cpu_limit, usable_cores


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
