"""``--threads`` / ``WSCHAT_THREADS``: parsed and checked by the CLI, and, through the real
``wschat-server`` on the tiny model, the count torch uses inside the engine's worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from wschat.server.runtime.cli import HELP_HINT, settings_from_args

from tests.prometheus import samples
from tests.support import TIMEOUT, free_port, raw_peer, wait_ready

START_TIMEOUT = 180.0  # a fresh interpreter importing torch and transformers on a shared machine


@pytest.fixture(autouse=True)
def no_threads_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WSCHAT_THREADS", raising=False)


@pytest.mark.parametrize(("value", "threads"), [("3", 3), ("1", 1), ("auto", None), ("AUTO", None)])
def test_the_threads_flag_sets_the_thread_count(value: str, threads: int | None) -> None:
    assert settings_from_args(["--threads", value]).threads == threads


def test_threads_are_auto_when_neither_flag_nor_env_says() -> None:
    assert settings_from_args([]).threads is None


def test_wschat_threads_sets_the_count_and_the_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WSCHAT_THREADS", "1")
    assert settings_from_args([]).threads == 1
    assert settings_from_args(["--threads", "2"]).threads == 2


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
@pytest.mark.parametrize("source", ["flag", "env"])
def test_a_bad_thread_count_is_refused_with_a_clear_message(
    value: str, source: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--threads", value] if source == "flag" else []
    if source == "env":
        monkeypatch.setenv("WSCHAT_THREADS", value)
    with pytest.raises(SystemExit) as exited:
        settings_from_args(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "wschat-server: error: argument --threads: expected 'auto' or a whole number of "
        f"threads, 1 or more (from the flag or WSCHAT_THREADS); got '{value}'",
        HELP_HINT,
    ]


@pytest.mark.parametrize(
    ("argv", "env", "threads"),
    [(["--threads", "3"], {}, 3), ([], {"WSCHAT_THREADS": "1"}, 1)],
    ids=["flag", "env"],
)
async def test_the_asked_thread_count_is_what_torch_uses_in_the_engine_worker(
    argv: list[str], env: dict[str, str], threads: int, tiny_text_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    command = [
        sys.executable, "-m", "wschat.server",
        "--model", str(tiny_text_dir),
        "--port", str(port),
        "--ping-interval-s", "0",
        *argv,
    ]  # fmt: skip
    with log.open("wb") as sink:
        proc = subprocess.Popen(command, env={**os.environ, **env}, stderr=sink)
    try:
        await wait_ready(proc, port, log, timeout=START_TIMEOUT)
        async with raw_peer(f"ws://127.0.0.1:{port}/v1/chat") as (peer, _):
            await peer.send(
                {"type": "prompt", "id": "p", "text": "hi", "params": {"max_new_tokens": 3}}
            )
            done = (await peer.recv_until("done"))[-1]
        assert done["reason"] == "length"
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            metrics = samples((await http.get(f"http://127.0.0.1:{port}/metrics")).text)
        assert metrics["wschat_engine_threads"] == threads
        assert (
            f"CPU threads: {threads} (asked for with --threads / WSCHAT_THREADS)" in log.read_text()
        )
    finally:
        proc.terminate()
        try:
            proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(TIMEOUT)
