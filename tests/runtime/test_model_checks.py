"""``wschat-server --model`` that names no model it can load: one line on stderr and exit status 2,
before anything loads (``server/runtime/model_checks.py``), as a process of its own."""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT, run_to_exit

# a process of its own imports torch before it checks
CHECK_TIMEOUT = 120.0
HUB_MODEL = "google/gemma-3-1b-it"


async def wschat_server(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """``wschat-server ARGS --port 0`` to its exit: its status and its stderr's lines."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    command = [sys.executable, "-m", "wschat.server", *args, "--port", "0"]
    status, _, err = await run_to_exit(command, env=environment, timeout=CHECK_TIMEOUT)
    return status, err.splitlines()


def empty_hub(tmp_path: Path) -> dict[str, str]:
    """An environment whose hub cache is an empty folder."""
    return {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub")}


async def test_a_folder_with_no_model_is_one_line_and_exit_2(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    assert await wschat_server("--model", str(folder)) == (
        2,
        [
            f"wschat-server: --model {folder}: no model in {folder} (no config.json; a model "
            "folder holds config.json and weights)"
        ],
    )


async def test_a_folder_with_a_config_and_no_weights_is_one_line_and_exit_2(
    tmp_path: Path,
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3_text"}))
    assert await wschat_server("--model", str(tmp_path)) == (
        2,
        [
            f"wschat-server: --model {tmp_path}: no weights in {tmp_path} (no .safetensors or "
            "pytorch_model .bin file)"
        ],
    )


async def test_a_hub_name_not_cached_with_the_hub_off_is_one_line_and_exit_2(
    tmp_path: Path,
) -> None:
    env = {**empty_hub(tmp_path), "HF_HUB_OFFLINE": "1"}
    assert await wschat_server("--model", HUB_MODEL, env=env) == (
        2,
        [
            f"wschat-server: --model {HUB_MODEL}: not in the hub's cache ({tmp_path}/hf/hub), "
            "and HF_HUB_OFFLINE is set: download it where the hub answers (hf download NAME) "
            "or give a model folder"
        ],
    )


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port nothing listens on (bound, never listening, for the test's length)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


async def test_a_hub_name_not_cached_with_the_hub_out_of_reach_is_one_line_and_exit_2(
    tmp_path: Path, closed_port: int
) -> None:
    endpoint = f"http://127.0.0.1:{closed_port}"
    env = {**empty_hub(tmp_path), "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": endpoint}
    status, lines = await wschat_server("--model", HUB_MODEL, env=env)
    assert (status, len(lines)) == (2, 1), lines
    assert lines[0] == (
        f"wschat-server: --model {HUB_MODEL}: not in the hub's cache ({tmp_path}/hf/hub), and "
        f"{endpoint} cannot be reached ([Errno 111] Connection refused): download it where the "
        "hub answers (hf download NAME) or give a model folder"
    )


def test_a_model_folder_passes_the_checks(tiny_text_dir: Path) -> None:
    from wschat.server.runtime.model_checks import folder_problem

    assert folder_problem(tiny_text_dir) is None
