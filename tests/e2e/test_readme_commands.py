"""The README's set-up command, as written, in a fresh venv without the system's site packages;
then that venv's ``wschat-server`` on the embedded model and its ``wschat ask``.

The command is read from the README (the block after its marker), so the two cannot drift. pip
finds the pinned CPU torch wherever this machine's pip configuration points (here a local
find-links folder); the server uses the model cache the other real-model tests converted."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from wschat.server.engine.local.loader import default_cache_dir

from tests.readme import readme_setup_command
from tests.support import command_until_ready, free_port, run_ask

pytestmark = pytest.mark.real_model

ROOT = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT = 1800.0  # torch and the server extra: about 3 minutes each on 2 busy cores
START_TIMEOUT = 600.0  # converts the GGUF if the cache is empty (about a minute)
# A reply that does not end on its own runs to the server's default length (256 tokens), on 2 busy
# cores at about 1 token/s.
ASK_TIMEOUT = 600.0
STOP_TIMEOUT = 60.0


def activated(venv: Path) -> dict[str, str]:
    """The environment of a shell with ``venv`` activated (and no WSCHAT_* settings). pip asks an
    index it cannot reach once more, not five times (as tests/run's torch install): where the
    packages come from a local folder, as here, the retries' back-off was half the install."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("WSCHAT_", "PYTHON")) and k != "VIRTUAL_ENV"
    }
    path = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    return env | {"VIRTUAL_ENV": str(venv), "PATH": path, "HF_HUB_OFFLINE": "1", "PIP_RETRIES": "1"}


async def run_shell(line: str, env: dict[str, str]) -> None:
    """``line`` in bash at the checkout's root, as a user types it; fails with its output."""
    done = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-c", line],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
    )
    assert done.returncode == 0, f"{line}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"


async def test_readme_setup_command_in_a_fresh_venv_serves_and_answers(tmp_path: Path) -> None:
    *installs, serve = (step.strip() for step in readme_setup_command().split("&&"))
    assert serve == "wschat-server" and installs
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    env = activated(venv)

    started = time.monotonic()
    await run_shell(" && ".join(installs), env)
    print(f"\nthe README's installs took {time.monotonic() - started:.0f} s")
    assert (venv / "bin" / "wschat").exists() and (venv / "bin" / "wschat-server").exists()

    port = free_port()
    cache = default_cache_dir()
    command = [str(venv / "bin" / serve), "--port", str(port), "--cache-dir", str(cache)]
    env["WSCHAT_URL"] = f"ws://127.0.0.1:{port}/v1/chat"
    async with command_until_ready(
        command, port, tmp_path / "server.log", env, START_TIMEOUT
    ) as server:
        status, out, err = await run_ask(
            "What is the capital of France?", env=env, timeout=ASK_TIMEOUT
        )
        assert status == 0, err
        assert out.strip(), "the reply was empty"
        server.terminate()
        async with asyncio.timeout(STOP_TIMEOUT):
            assert await asyncio.to_thread(server.wait) == 0
