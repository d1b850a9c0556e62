"""The engine kinds (``server/runtime/engines.py`` ``ENGINE_KINDS``): the one table that says what
``--engine`` may name. Every kind's extras are pyproject.toml's, and the CLI's choices, its
missing-extra line, its checks before loading and ``make_engine`` all read the table, so a new
kind is one entry there."""

from __future__ import annotations

import re
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest
from wschat.server.engine import Engine
from wschat.server.runtime.cli import main, settings_from_args
from wschat.server.runtime.engines import ENGINE_KINDS, EngineKind, make_engine
from wschat.server.runtime.extras import EXTRA_MODULES
from wschat.server.settings import Settings

from tests.fakes.scripted import Script, ScriptedEngine

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


@pytest.mark.parametrize("name", list(ENGINE_KINDS))
def test_every_kind_needs_extras_that_pyproject_declares_and_names_their_modules(
    name: str,
) -> None:
    kind = ENGINE_KINDS[name]
    assert kind.name == name
    assert kind.extras and set(kind.extras) <= set(EXTRAS) & set(EXTRA_MODULES)
    assert kind.modules and set(kind.modules) == {m for e in kind.extras for m in EXTRA_MODULES[e]}


def test_the_engine_option_describes_every_kind() -> None:
    meaning = next(f for f in fields(Settings) if f.name == "engine").metadata["help"]
    assert re.findall(r"`(\w+)`: ", meaning) == list(ENGINE_KINDS)


@pytest.mark.parametrize("name", list(ENGINE_KINDS))
def test_the_command_line_takes_every_kind(name: str) -> None:
    assert settings_from_args(["--engine", name]).engine == name


def test_an_engine_not_in_the_table_is_refused_with_the_tables_names(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WSCHAT_ENGINE", "bogus")
    with pytest.raises(SystemExit):
        settings_from_args([])
    assert capsys.readouterr().err.splitlines()[0] == (
        "wschat-server: error: WSCHAT_ENGINE: invalid choice 'bogus' (choose from "
        f"{', '.join(ENGINE_KINDS)})"
    )
    with pytest.raises(ValueError) as refused:
        make_engine(Settings(engine="bogus"))
    assert str(refused.value) == f"unknown engine 'bogus': choose one of {tuple(ENGINE_KINDS)}"


def scripted(settings: Settings) -> Engine:
    return ScriptedEngine(lambda request: Script([" hi"]))


def test_a_new_kind_is_one_entry_the_command_line_and_the_builder_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(ENGINE_KINDS, "scripted", EngineKind("scripted", ("server",), scripted))
    settings = settings_from_args(["--engine", "scripted"])
    assert settings.engine == "scripted"
    assert isinstance(make_engine(settings), ScriptedEngine)


def test_a_kinds_missing_extra_is_the_line_wschat_server_prints(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(EXTRA_MODULES, "elsewhere", ("wschat_no_such_module",))
    kind = EngineKind("scripted", ("gateway", "elsewhere"), scripted)
    monkeypatch.setitem(ENGINE_KINDS, "scripted", kind)
    assert main(["--engine", "scripted", "--port", "0"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "wschat-server --engine scripted needs the gateway and elsewhere extras (missing: "
        'wschat_no_such_module): pip install -e ".[gateway,elsewhere]" in the wschat checkout'
    ]


def test_a_kinds_checks_run_before_it_loads(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_room(settings: Settings) -> str:
        return f"no room for {settings.model}"

    kind = EngineKind("scripted", ("gateway",), scripted, checks=(lambda s: None, no_room))
    monkeypatch.setitem(ENGINE_KINDS, "scripted", kind)
    assert main(["--engine", "scripted", "--port", "0"]) == 2
    assert capsys.readouterr().err.splitlines() == ["wschat-server: no room for embedded"]


def test_a_model_folder_is_looked_for_only_where_the_kind_is_local(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A local kind refuses a --model folder that is not there (tests/runtime/test_cli.py); one
    that is not local leaves --model to its builder."""
    remote = EngineKind("scripted", ("gateway",), scripted)
    monkeypatch.setitem(ENGINE_KINDS, "scripted", remote)
    nowhere = str(tmp_path / "nowhere")
    assert settings_from_args(["--engine", "scripted", "--model", nowhere]).model == nowhere
    monkeypatch.setitem(
        ENGINE_KINDS, "scripted", EngineKind("scripted", ("server",), scripted, local=True)
    )
    with pytest.raises(SystemExit):
        settings_from_args(["--engine", "scripted", "--model", nowhere])
