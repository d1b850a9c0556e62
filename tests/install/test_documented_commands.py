"""The README's commands and the files that repeat them agree: the test command is ``tests/run``,
``.ci/run`` runs exactly it (then the gates), and one torch pin serves the README, tests/run and
the server's message."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from wschat.server.runtime.extras import TORCH_CPU_INDEX, TORCH_CPU_INSTALL, TORCH_CPU_PIN

from tests.readme import (
    SETUP_MARKER,
    VENV_MARKER,
    readme_setup_command,
    readme_test_command,
    readme_venv_command,
)

ROOT = Path(__file__).resolve().parents[2]


def shell_lines(path: Path) -> list[str]:
    """A script's commands: its lines less blanks and comments."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_the_readme_test_command_is_tests_run() -> None:
    assert readme_test_command() == "tests/run"


def test_ci_runs_exactly_the_readme_test_command_then_the_gates() -> None:
    assert shell_lines(ROOT / ".ci/run")[-2:] == [readme_test_command(), ".ci/gates"]


def test_tests_run_ends_in_pytest_on_two_workers_with_its_arguments() -> None:
    command = 'HF_HUB_OFFLINE=1 exec python3 -m pytest -q -n 2 --dist loadfile --durations=25 "$@"'
    assert shell_lines(ROOT / "tests/run")[-1] == command
    # the README says the same (its line wraps where a space was)
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "`HF_HUB_OFFLINE=1 python3 -m pytest -q -n 2 --dist loadfile --durations=25`" in readme


def test_the_set_up_command_adds_pytorchs_index_for_the_cpu_torch_then_runs_the_server() -> None:
    # --extra-index-url, not --index-url: torch's dependencies come from the index pip uses
    # (a mirror), and the +cpu pin is found on PyTorch's index alone
    steps = [step.strip() for step in readme_setup_command().split("&&")]
    assert steps == [TORCH_CPU_INSTALL, 'pip install -e ".[server]"', "wschat-server"]
    assert TORCH_CPU_INSTALL == (
        "pip install torch==2.13.0+cpu --extra-index-url https://download.pytorch.org/whl/cpu"
    )


def test_the_readme_makes_a_virtualenv_before_it_installs() -> None:
    assert readme_venv_command() == "python3 -m venv .venv && . .venv/bin/activate"
    readme = (ROOT / "README.md").read_text()
    assert readme.index(VENV_MARKER) < readme.index(SETUP_MARKER)


# pip installing this checkout: "." or ".[extras]", quoted or not, after its options
CHECKOUT_INSTALL = re.compile(r"pip install ((?:-\S+ )*)(\"?\.(?:\[[^\]]*\])?\"?)(?=[\s`]|$)")


@pytest.mark.parametrize("doc", ["README.md", "docs/deploy.md"])
def test_every_install_of_the_checkout_the_docs_give_is_editable(doc: str) -> None:
    # a plain install after the set-up's editable one replaces it with a copy of today's files
    text = " ".join((ROOT / doc).read_text().split())
    installs = CHECKOUT_INSTALL.findall(text)
    assert installs
    assert [f"pip install {o}{t}" for o, t in installs if "-e " not in o] == []


def test_tests_run_installs_the_same_torch_pin() -> None:
    variables = dict(re.findall(r'^(TORCH_\w+)="([^"]*)"$', (ROOT / "tests/run").read_text(), re.M))
    assert variables == {"TORCH_CPU_PIN": TORCH_CPU_PIN, "TORCH_CPU_INDEX": TORCH_CPU_INDEX}
    assert (
        '"$TORCH_CPU_PIN" --extra-index-url "$TORCH_CPU_INDEX"' in (ROOT / "tests/run").read_text()
    )
