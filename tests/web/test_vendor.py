"""The vendored browser libraries (``server/web/static/vendor/``) are the files published on
npm: each one's sha256 is the one ``vendor/README`` records, and every file is recorded."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

VENDOR = Path(__file__).resolve().parents[2] / "server" / "web" / "static" / "vendor"
# ``<sha256>  <path under vendor/>``, as sha256sum writes it
RECORD = re.compile(r"^\s+([0-9a-f]{64})  (\S+)$", re.MULTILINE)
NOT_VENDORED = ("README", "*.LICENSE")


def mismatches(folder: Path) -> list[str]:
    """Each vendored file whose sha256 is not the recorded one, or that has no record, and
    each record of a file that is not there."""
    recorded = {path: digest for digest, path in RECORD.findall((folder / "README").read_text())}
    found = {
        path.relative_to(folder).as_posix(): path
        for path in sorted(folder.rglob("*"))
        if path.is_file() and not any(path.match(pattern) for pattern in NOT_VENDORED)
    }
    wrong = [
        f"{name}: sha256 {hashlib.sha256(path.read_bytes()).hexdigest()}"
        for name, path in found.items()
        if hashlib.sha256(path.read_bytes()).hexdigest() != recorded.get(name)
    ]
    return wrong + [f"{name}: recorded, not there" for name in sorted(recorded.keys() - found)]


def test_each_vendored_file_is_the_one_its_record_names() -> None:
    assert len(RECORD.findall((VENDOR / "README").read_text())) == 18
    assert mismatches(VENDOR) == []


def test_an_edited_file_and_a_file_without_a_record_are_seen(tmp_path: Path) -> None:
    copy = tmp_path / "vendor"
    shutil.copytree(VENDOR, copy)
    with (copy / "msgpack" / "utils" / "utf8.mjs").open("a") as edited:
        edited.write("\n")
    (copy / "msgpack" / "extra.mjs").write_text("export {};\n")
    (copy / "markdown-it.min.js").unlink()
    edited_digest = hashlib.sha256((copy / "msgpack" / "utils" / "utf8.mjs").read_bytes())
    assert mismatches(copy) == [
        "msgpack/extra.mjs: sha256 " + hashlib.sha256(b"export {};\n").hexdigest(),
        f"msgpack/utils/utf8.mjs: sha256 {edited_digest.hexdigest()}",
        "markdown-it.min.js: recorded, not there",
    ]
