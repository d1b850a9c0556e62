"""pyproject.toml's version bounds hold what is installed, and the packages whose internals the
server leans on (it subclasses their classes, patches their methods or calls their private
functions) have an upper bound: an upgrade past the versions the tests ran on fails here, by
name, instead of somewhere inside a connection or a forward pass."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.runtime.test_extras import PYPROJECT, canonical

# the package, and what of its insides the server uses
INTERNALS = {
    "uvicorn": "runtime/http_protocol.py and runtime/transport.py subclass its h11 and "
    "websockets-sansio protocols and read their state (close_timer, disconnected, the request "
    "cycle: first in 0.53); runtime/shutdown.py subclasses its Server",
    "websockets": "runtime/transport.py empties the frames its parser keeps and fails the "
    "connection through its protocol object",
    "transformers": "engine/local registers attention under the model's own name, reads "
    "_attn_implementation and calls private tokenizer methods",
    "torch": "engine/local/packed.py calls torch.ops.mkldnn's private ops",
}


def requirements(*, client: bool = True) -> list[Requirement]:
    """Every requirement of pyproject.toml; ``client=False``: the extras' alone (the client
    install uses websockets' public API only)."""
    project = PYPROJECT["project"]
    every = [*project["dependencies"]] if client else []
    for extra in project["optional-dependencies"].values():
        every += extra
    return [Requirement(r) for r in every if not r.startswith("wschat[")]


def installed(name: str) -> Version | None:
    try:
        return Version(version(name))
    except PackageNotFoundError:
        return None


@pytest.mark.parametrize("requirement", requirements(), ids=str)
def test_every_bound_holds_the_installed_version(requirement: Requirement) -> None:
    found = installed(requirement.name)
    if found is None:  # an extra this machine does not install (flash-attn: CUDA)
        pytest.skip(f"{requirement.name} is not installed")
    assert requirement.specifier.contains(found, prereleases=True), (str(requirement), found)


def test_every_package_whose_internals_we_use_has_an_upper_bound_everywhere() -> None:
    extras = requirements(client=False)
    for package in INTERNALS:
        assert package in {canonical(r.name) for r in extras}, package
        for requirement in extras:
            if canonical(requirement.name) == package:
                operators = {spec.operator for spec in requirement.specifier}
                assert ">=" in operators and operators & {"<", "=="}, str(requirement)
