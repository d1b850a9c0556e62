"""The README's commands as the tests read them, so that a test runs what the README says."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
SETUP_MARKER = "<!-- set-up command: tests/e2e/test_readme_commands.py runs it as written -->"
VENV_MARKER = "<!-- virtualenv step: tests/e2e/test_readme_commands.py runs it as written -->"


def _first_bash_block(text: str) -> list[str]:
    """The lines of the first ```bash block in ``text``."""
    block = re.search(r"```bash\n(.*?)\n```", text, re.DOTALL)
    assert block, "no ```bash block"
    return block.group(1).splitlines()


def _marked_line(marker: str) -> str:
    """The one-line command in the bash block after ``marker``."""
    text = README.read_text()
    assert marker in text, f"the README lost the marker {marker}"
    lines = _first_bash_block(text.split(marker, 1)[1])
    assert len(lines) == 1, f"the command after {marker} is one line, not {lines}"
    return lines[0]


def readme_setup_command() -> str:
    """The one-line set-up and run command (the block after its marker)."""
    return _marked_line(SETUP_MARKER)


def readme_venv_command() -> str:
    """The virtual environment step before it (the block after its marker)."""
    return _marked_line(VENV_MARKER)


def readme_test_command() -> str:
    """The command of the section "Run the tests"."""
    section = README.read_text().split("\n## Run the tests\n", 1)[1].split("\n## ", 1)[0]
    (line,) = _first_bash_block(section)
    return line
