"""The README's virtualenv step and set-up command, as written (a fresh venv without the
system's site packages, in a folder of the test's own); then that venv's ``wschat-server`` on
the embedded model and its ``wschat ask``.

The commands are read from the README (the blocks after their markers), so the two cannot drift.
pip finds the pinned CPU torch wherever this machine's pip configuration points (here a local
find-links folder); the server uses the model cache the other real-model tests converted."""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from wschat.server.engine.embedded import default_cache_dir

from tests.readme import readme_setup_command, readme_venv_command
from tests.support import command_until_ready, free_port, run_ask

pytestmark = pytest.mark.real_model

ROOT = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT = 1800.0  # torch and the server extra: about 3 minutes each on 2 busy cores
START_TIMEOUT = 600.0  # converts the GGUF if the cache is empty (about a minute)
# A reply that does not end on its own runs to the server's default length (256 tokens), on 2 busy
# cores at about 1 token/s.
ASK_TIMEOUT = 600.0
STOP_TIMEOUT = 60.0


def user_shell() -> dict[str, str]:
    """The environment of a user's shell: no venv active, no WSCHAT_* settings. pip asks an index
    it cannot reach once more, not five times (as tests/run's torch install): where the packages
    come from a local folder, as here, the retries' back-off was half the install."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("WSCHAT_", "PYTHON")) and k != "VIRTUAL_ENV"
    }
    if "VIRTUAL_ENV" in os.environ:  # the one the tests run in: off the PATH, as deactivated
        active = str(Path(os.environ["VIRTUAL_ENV"]) / "bin")
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != active)
    return env | {"HF_HUB_OFFLINE": "1", "PIP_RETRIES": "1"}


def activated(venv: Path) -> dict[str, str]:
    """The environment of that shell with ``venv`` activated."""
    env = user_shell()
    return env | {"VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}"}


async def run_shell(line: str, env: dict[str, str], cwd: Path = ROOT) -> None:
    """``line`` in bash in ``cwd`` (the checkout's root), as a user types it; fails with its
    output."""
    done = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-c", line],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
    )
    assert done.returncode == 0, f"{line}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"


async def test_readme_setup_command_in_a_fresh_venv_serves_and_answers(tmp_path: Path) -> None:
    *installs, serve = (step.strip() for step in readme_setup_command().split("&&"))
    assert serve == "wschat-server" and installs
    # the venv step makes .venv where it runs: here the test's folder, not the checkout
    line = f"{readme_venv_command()} && cd {shlex.quote(str(ROOT))} && {' && '.join(installs)}"
    started = time.monotonic()
    await run_shell(line, user_shell(), cwd=tmp_path)
    print(f"\nthe README's venv and installs took {time.monotonic() - started:.0f} s")
    venv = tmp_path / ".venv"
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    assert (venv / "bin" / "wschat").exists() and (venv / "bin" / "wschat-server").exists()
    env = activated(venv)

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
