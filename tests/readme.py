"""The README's commands as the tests read them, so that a test runs what the README says."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
SETUP_MARKER = "<!-- set-up command: tests/e2e/test_readme_commands.py runs it as written -->"


def _first_bash_block(text: str) -> list[str]:
    """The lines of the first ```bash block in ``text``."""
    block = re.search(r"```bash\n(.*?)\n```", text, re.DOTALL)
    assert block, "no ```bash block"
    return block.group(1).splitlines()


def readme_setup_command() -> str:
    """The one-line set-up and run command (the block after the marker)."""
    text = README.read_text()
    assert SETUP_MARKER in text, "the README lost the set-up command's marker"
    lines = _first_bash_block(text.split(SETUP_MARKER, 1)[1])
    assert len(lines) == 1, f"the set-up command is one line, not {lines}"
    return lines[0]


def readme_test_command() -> str:
    """The command of the section "Run the tests"."""
    section = README.read_text().split("\n## Run the tests\n", 1)[1].split("\n## ", 1)[0]
    (line,) = _first_bash_block(section)
    return line
