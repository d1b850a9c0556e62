"""The README's options table, written from each setting's one description in
``server/settings.py`` (a test keeps the README equal to it).

    python -m tests.runtime.readme_options           prints the table
    python -m tests.runtime.readme_options --write   writes it into README.md
"""

from __future__ import annotations

import sys
from itertools import takewhile
from pathlib import Path

from wschat.server.settings import Settings

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- options table: python -m tests.runtime.readme_options --write -->"
# The options the README shows, in its order (`wschat-server --help` lists them all)
OPTIONS = (
    "model",
    "cache_dir",
    "device",
    "dtype",
    "prompt_format",
    "engine",
    "threads",
    "max_concurrent",
    "max_new_tokens",
    "default_max_new_tokens",
    "context_tokens",
    "kv_budget_mib",
    "shared_openings",
    "grammar_vocabulary",
    "session_store",
    "resume_grace_s",
    "session_lease_s",
    "max_connections_per_client",
    "responses_kept",
    "responses_kept_mib",
    "responses_kept_s",
    "body_timeout_s",
    "max_pending_handshakes",
    "max_pending_handshakes_per_client",
)


def default_cell(value: object) -> str:
    """A default as the table shows it: none where the meaning says it (None, no values)."""
    if value is None or value == ():
        return ""
    if isinstance(value, float):
        return f"{value:g}"
    return f"`{value}`" if isinstance(value, str) else str(value)


def table() -> str:
    defaults = Settings()
    fields = Settings.__dataclass_fields__
    rows = ["| option | default | meaning |", "|---|---|---|"]
    for name in OPTIONS:
        meaning = fields[name].metadata["help"]
        flag = f"--{name.replace('_', '-')}"
        rows.append(f"| `{flag}` | {default_cell(getattr(defaults, name))} | {meaning} |")
    return "\n".join(rows) + "\n"


def readme_table(text: str) -> str:
    """The table that follows the marker in the README's text."""
    assert MARKER in text, "the README lost its options table's marker"
    lines = text.split(MARKER + "\n", 1)[1].splitlines(keepends=True)
    return "".join(takewhile(lambda line: line.startswith("|"), lines))


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print(table(), end="")
        return 0
    text = README.read_text()
    old = readme_table(text)
    README.write_text(text.replace(MARKER + "\n" + old, MARKER + "\n" + table(), 1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
