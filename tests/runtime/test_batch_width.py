"""``--max-concurrent auto``: the flag, and the width the batched engine ends up with (the rule
itself: tests/engine/test_batch_width.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from wschat.server.runtime.cli import HELP_HINT, settings_from_args
from wschat.server.runtime.engines import make_engine
from wschat.server.settings import PREFERRED, Settings


@pytest.mark.parametrize(("value", "width"), [("auto", None), ("Auto", None), ("12", 12)])
def test_the_max_concurrent_flag_reads_auto_or_a_count(value: str, width: int | None) -> None:
    assert settings_from_args(["--max-concurrent", value]).max_concurrent == width


def test_max_concurrent_is_auto_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WSCHAT_MAX_CONCURRENT", raising=False)
    assert settings_from_args([]).max_concurrent is None


@pytest.mark.parametrize("value", ["0", "many"])
def test_a_bad_max_concurrent_is_refused_with_a_clear_message(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        settings_from_args(["--max-concurrent", value])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "wschat-server: error: argument --max-concurrent: expected 'auto' or a whole number of "
        f"generations, 1 or more (from the flag or WSCHAT_MAX_CONCURRENT); got '{value}'",
        HELP_HINT,
    ]


@pytest.mark.parametrize(("asked", "width"), [(None, PREFERRED["cpu"]), (3, 3)])
async def test_the_batched_engine_gets_the_asked_width_or_the_cpu_default(
    tiny_text_dir: Path, asked: int | None, width: int
) -> None:
    # the tiny model's rows take a few MiB: any machine that runs the tests holds the default
    settings = Settings(model=str(tiny_text_dir), dtype="fp32", max_concurrent=asked)
    engine = make_engine(settings)
    try:
        assert engine.info.batch_width == width
    finally:
        await engine.aclose()


async def test_the_generate_engine_says_no_batch_width(tiny_text_dir: Path) -> None:
    engine = make_engine(Settings(model=str(tiny_text_dir), dtype="fp32", engine="generate"))
    try:
        assert engine.info.batch_width is None
    finally:
        await engine.aclose()
