"""Each extra's modules (``server/runtime/extras.py``) are the distributions its requirements in
pyproject.toml name, less the base install's, and the line a missing one gets says what to run."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from wschat.server.runtime.extras import (
    EXTRA_MODULES,
    TORCH_CPU_INSTALL,
    missing_extras_message,
    missing_modules,
    modules_of,
)

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    found = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert found, requirement
    return canonical(found.group(0))


@pytest.mark.parametrize("extra", sorted(EXTRA_MODULES))
def test_an_extras_modules_are_those_of_its_requirements_less_the_base_install(extra: str) -> None:
    base = {requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    wanted = {requirement_name(r) for r in PYPROJECT["project"]["optional-dependencies"][extra]}
    providers = packages_distributions()
    checked = {canonical(d) for m in EXTRA_MODULES[extra] for d in providers[m]}
    assert checked == wanted - base


def test_the_modules_of_several_extras_are_each_named_once_in_their_order() -> None:
    assert modules_of(["gateway", "llamacpp"]) == (*EXTRA_MODULES["gateway"], "xllamacpp")


def test_a_module_that_cannot_be_found_is_missing() -> None:
    assert missing_modules(["json", "wschat_no_such_module", "msgpack"]) == [
        "wschat_no_such_module"
    ]


def test_the_server_extras_line_installs_torch_first_and_names_no_engine() -> None:
    assert missing_extras_message("generate", ["server"], ["torch", "PIL"]) == (
        f"wschat-server needs the server extra (missing: torch, PIL): {TORCH_CPU_INSTALL} (or "
        'the torch build for your machine), then pip install -e ".[server]" in the wschat checkout'
    )


def test_another_engines_line_names_it_and_all_its_extras() -> None:
    assert missing_extras_message("llamacpp", ["gateway", "llamacpp"], ["xllamacpp"]) == (
        "wschat-server --engine llamacpp needs the gateway and llamacpp extras (missing: "
        'xllamacpp): pip install -e ".[gateway,llamacpp]" in the wschat checkout'
    )
    assert missing_extras_message("openai", ["gateway"], ["httpx"]) == (
        "wschat-server --engine openai needs the gateway extra (missing: httpx): "
        'pip install -e ".[gateway]" in the wschat checkout'
    )
