"""The README's commands and the files that repeat them agree: the test command is ``tests/run``,
``.ci/run`` runs exactly it (then the gates), and one torch pin serves the README, tests/run and
the server's message."""

from __future__ import annotations

import re
from pathlib import Path

from wschat.server.runtime.cli import TORCH_CPU_INDEX, TORCH_PIN

from tests.readme import readme_setup_command, readme_test_command

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
    command = 'HF_HUB_OFFLINE=1 exec python3 -m pytest -q -n 2 --dist loadfile "$@"'
    assert shell_lines(ROOT / "tests/run")[-1] == command
    # the README says the same (its line wraps where a space was)
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "`HF_HUB_OFFLINE=1 python3 -m pytest -q -n 2 --dist loadfile`" in readme


def test_the_set_up_command_installs_the_pinned_cpu_torch_then_the_server_and_runs_it() -> None:
    steps = [step.strip() for step in readme_setup_command().split("&&")]
    assert steps == [
        f"pip install {TORCH_PIN} --index-url {TORCH_CPU_INDEX}",
        'pip install -e ".[server]"',
        "wschat-server",
    ]


def test_tests_run_installs_the_same_torch_pin() -> None:
    variables = dict(re.findall(r'^(TORCH_\w+)="([^"]*)"$', (ROOT / "tests/run").read_text(), re.M))
    assert variables == {"TORCH_PIN": TORCH_PIN, "TORCH_CPU_INDEX": TORCH_CPU_INDEX}
