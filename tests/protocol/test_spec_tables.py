"""``protocol/PROTOCOL.md``'s tables list exactly what the code has, so the two cannot drift
(STYLE.md 3)."""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path

import pytest
from wschat.protocol import (
    MODEL_LOADING_REASON,
    CloseCode,
    ErrorCode,
    FinishReason,
    FrameType,
    GenerationParams,
    Limits,
    Ready,
    Stats,
)
from wschat.protocol.constants import CLIENT_FRAME_TYPES
from wschat.protocol.frames import CLIENT_FRAMES, SERVER_FRAMES

SPEC = Path(__file__).resolve().parents[2] / "protocol" / "PROTOCOL.md"


@cache
def spec_lines() -> list[str]:
    return SPEC.read_text(encoding="utf-8").splitlines()


def table_after(marker: str) -> list[list[str]]:
    """The rows (cells, backticks stripped) of the first table after the line starting with
    ``marker``; the header row and the separator are left out."""
    lines = spec_lines()
    start = next(i for i, line in enumerate(lines) if line.startswith(marker))
    rows: list[list[str]] = []
    for line in lines[start + 1 :]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split(" | ")]
        rows.append(cells)
    assert len(rows) > 2, f"no table after {marker!r}"
    return rows[2:]


def first_column(marker: str) -> list[str]:
    return [row[0] for row in table_after(marker)]


def test_frame_types_table_lists_every_frame_type_with_its_direction() -> None:
    rows = table_after("### Frame types")
    assert [r[0] for r in rows] == [t.value for t in FrameType]
    clients = {r[0] for r in rows if r[1] == "client"}
    servers = {r[0] for r in rows if r[1] == "server"}
    assert clients == CLIENT_FRAME_TYPES == set(CLIENT_FRAMES)
    assert servers == set(FrameType) - CLIENT_FRAME_TYPES == set(SERVER_FRAMES)


def test_error_codes_table_lists_every_error_code() -> None:
    assert first_column("### Error codes") == [c.value for c in ErrorCode]


def test_finish_reasons_table_lists_every_finish_reason() -> None:
    assert first_column("### Finish reasons") == [r.value for r in FinishReason]


def test_close_codes_table_lists_every_close_code() -> None:
    rows = table_after("### Close codes")
    assert [int(r[0]) for r in rows] == [c.value for c in CloseCode]
    assert [r[1] for r in rows] == [c.name.lower().replace("_", " ") for c in CloseCode]


def test_close_codes_table_gives_the_loading_reason_clients_act_on() -> None:
    (row,) = [r for r in table_after("### Close codes") if r[0] == str(CloseCode.TRY_AGAIN_LATER)]
    assert f"reason exactly `{MODEL_LOADING_REASON}`" in row[2]


def test_params_table_lists_every_generation_param() -> None:
    names = [f.name for f in dataclasses.fields(GenerationParams)]
    assert first_column("## 6. `params`") == names


def test_limits_table_lists_every_field_of_limits() -> None:
    assert first_column("`limits` (the first five") == [f.name for f in dataclasses.fields(Limits)]


@pytest.mark.parametrize(
    ("marker", "frame"), [("## 4. Session start", Ready), ("`stats` fields:", Stats)]
)
def test_frame_field_tables_list_every_field(marker: str, frame: type) -> None:
    documented = [name for name in first_column(marker) if name != "type"]
    assert documented == [f.name for f in dataclasses.fields(frame)]
