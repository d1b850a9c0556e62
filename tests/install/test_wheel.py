"""The wheel installs one top-level package, ``wschat``, with every module and data file of the
``protocol/``, ``server/`` and ``client/`` folders, and nothing of ``bench/`` or ``tests/``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 300.0
# The folders the wschat.* packages map onto, with the package each one becomes.
PACKAGES = {"protocol": "wschat/protocol", "server": "wschat/server", "client": "wschat/client"}
DATA = ("protocol/PROTOCOL.md", "protocol/vectors", "server/web/static")
# What a build writes or a checkout holds besides the sources (.git, caches, venvs).
NOT_SOURCES = shutil.ignore_patterns(".*", "__pycache__", "*.egg-info", "build", "dist")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    """The wheel built from a copy of the checkout (a build writes into the tree it builds)."""
    source = tmp_path_factory.mktemp("source") / "wschat"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    out = tmp_path_factory.mktemp("wheel")
    build = ["wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)]
    built = subprocess.run(
        [sys.executable, "-m", "pip", *build], timeout=BUILD_TIMEOUT, capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr
    (path,) = out.glob("wschat-*.whl")
    with zipfile.ZipFile(path) as archive:
        yield archive


def source_files(relative: str) -> list[Path]:
    path = ROOT / relative
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return [f for f in files if "__pycache__" not in f.parts]


def in_wheel(path: Path) -> str:
    folder, _, rest = path.relative_to(ROOT).as_posix().partition("/")
    return f"{PACKAGES[folder]}/{rest}"


def test_wheel_installs_only_the_wschat_package(wheel: zipfile.ZipFile) -> None:
    tops = {name.split("/")[0] for name in wheel.namelist()}
    dist_info = [t for t in tops if t.endswith(".dist-info")]
    assert len(dist_info) == 1 and dist_info[0].startswith("wschat-")
    assert tops == {"wschat", dist_info[0]}


def test_wheel_holds_every_module_of_the_three_folders(wheel: zipfile.ZipFile) -> None:
    modules = [p for folder in PACKAGES for p in source_files(folder) if p.suffix == ".py"]
    assert len(modules) > 40
    assert sorted({in_wheel(p) for p in modules} - set(wheel.namelist())) == []


def test_wheel_holds_the_package_data(wheel: zipfile.ZipFile) -> None:
    data = [p for relative in DATA for p in source_files(relative)]
    names = {in_wheel(p) for p in data}
    assert {"wschat/protocol/PROTOCOL.md", "wschat/server/web/static/index.html"} <= names
    assert any(n.startswith("wschat/protocol/vectors/") for n in names)
    assert sorted(names - set(wheel.namelist())) == []


def test_wheel_console_scripts_point_into_the_wschat_package(wheel: zipfile.ZipFile) -> None:
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(entry_points).decode()
    assert "wschat = wschat.client.cli:main" in text
    assert "wschat-server = wschat.server.runtime.cli:main" in text
