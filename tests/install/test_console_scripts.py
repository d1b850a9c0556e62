"""The console scripts after a client-only install: ``wschat`` works without any of the server's
dependencies, and ``wschat-server`` says in one line what to install. The server extra's modules
are made absent by a meta-path finder that a ``-c`` prelude installs before the entry point runs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tomllib
from pathlib import Path

from wschat.server.runtime.extras import EXTRA_MODULES, SERVER, TORCH_CPU_INSTALL

from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import running_server

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
RUN_TIMEOUT = 60.0
SERVER_EXTRA_MODULES = EXTRA_MODULES[SERVER]
# What the client must never need: the server extra, and numpy that torch brings.
BLOCKED = (*SERVER_EXTRA_MODULES, "numpy")

PRELUDE = """
import importlib.abc, json, sys

BLOCKED = {blocked!r}
asked = []


class NotInstalled(importlib.abc.MetaPathFinder):
    # An import of a blocked package fails as if it were not installed, and is recorded.
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            asked.append(name)
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
try:
    from {module} import {function} as entry_point
    status = entry_point()
finally:
    with open({report!r}, "w") as report:
        json.dump(asked, report)
sys.exit(status)
"""


async def run_script(
    script: str, *args: str, tmp_path: Path
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Runs console script ``script`` (its entry point from pyproject.toml) with the server's
    dependencies absent; returns the process and the blocked imports it tried."""
    module, function = PYPROJECT["project"]["scripts"][script].split(":")
    report = tmp_path / f"{script}-blocked-imports.json"
    code = PRELUDE.format(blocked=BLOCKED, module=module, function=function, report=str(report))
    # -I: the checkout's folders are not on sys.path; the installed package is what runs.
    command = [sys.executable, "-I", "-c", code, *args]
    result = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=tmp_path
    )
    return result, json.loads(report.read_text())


async def test_wschat_ask_works_without_the_server_dependencies(tmp_path: Path) -> None:
    engine = ScriptedEngine(lambda request: Script([" Paris", " is", " there."]))
    async with running_server(engine) as url:
        result, asked = await run_script("wschat", "ask", "--url", url, "hi", tmp_path=tmp_path)
    assert (result.returncode, result.stdout) == (0, " Paris is there.\n"), result.stderr
    assert asked == []


async def test_wschat_server_without_its_extra_says_what_to_install_and_exits_2(
    tmp_path: Path,
) -> None:
    result, asked = await run_script("wschat-server", "--port", "0", tmp_path=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    missing = ", ".join(SERVER_EXTRA_MODULES)
    assert lines[0].startswith(f"wschat-server needs the server extra (missing: {missing}): ")
    assert TORCH_CPU_INSTALL in lines[0] and 'pip install -e ".[server]"' in lines[0]
    assert set(asked) == set(SERVER_EXTRA_MODULES)  # the prelude really hid them


async def test_wschat_server_help_works_without_its_extra(tmp_path: Path) -> None:
    result, asked = await run_script("wschat-server", "--help", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: wschat-server") and "WSCHAT_<NAME>" in result.stdout
    assert asked == []
