"""Suite-wide fixtures: tiny random Gemma 3 models through the real loader, llama.cpp's server on
the embedded GGUF (started once, for the openai engine's tests and the conformance tests), a
check that no generation thread outlives its test, and a state folder for the ``wschat``
command; and ``--coverage-only-in``, which lets one run of the whole suite measure the coverage
gate's figure (.ci/coverage.sh)."""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support import free_port, generation_threads

if TYPE_CHECKING:  # torch loads only for the tests that use these fixtures
    from wschat.server.engine.local.hf import HFEngine
    from wschat.server.engine.local.loader import LoadedModel
    from wschat.server.engine.openai import OpenAIEngine

    from tests.openai.llama import LlamaServer

THREAD_EXIT_TIMEOUT = 10.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--coverage-only-in",
        action="append",
        default=[],
        metavar="FOLDER",
        help="under --cov: measure only while the tests in FOLDER run (and while tests are "
        "collected); coverage pauses for every other test. Repeatable.",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Pauses coverage for a test outside every ``--coverage-only-in`` folder, from its set-up
    to its teardown; .ci/run measures the gated modules on their own tests this way, in the same
    run as the rest of the suite."""
    folders = [item.config.rootpath / f for f in item.config.getoption("coverage_only_in")]
    if not folders or any(item.path.is_relative_to(folder) for folder in folders):
        return (yield)
    from coverage import Coverage

    coverage = Coverage.current()
    if coverage is None:  # the option without --cov
        return (yield)
    coverage.stop()
    try:
        return (yield)
    finally:
        coverage.start()


@pytest.fixture(autouse=True, scope="session")
def client_state_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The ``wschat`` command remembers the servers that answered under ``$XDG_STATE_HOME``
    (client/waiting.py): the suite's, in a folder of this run rather than the user's."""
    before = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("client-state"))
    yield
    if before is None:
        del os.environ["XDG_STATE_HOME"]
    else:
        os.environ["XDG_STATE_HOME"] = before


@pytest.fixture(autouse=True)
def no_generation_thread_left() -> Iterator[None]:
    """Every generation a test starts has ended (its thread exited) once the test is over."""
    before = set(generation_threads())
    yield
    started: list[threading.Thread] = [t for t in generation_threads() if t not in before]
    for thread in started:
        thread.join(THREAD_EXIT_TIMEOUT)
    left = [t.name for t in started if t.is_alive()]
    assert not left, f"generation threads still running after the test: {left}"


@pytest.fixture(scope="session")
def tiny_text_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from wschat.server.engine.local.devmodel import build_tiny_text_model

    return build_tiny_text_model(tmp_path_factory.mktemp("tiny-text"))


@pytest.fixture(scope="session")
def tiny_vision_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from wschat.server.engine.local.devmodel import build_tiny_vision_model

    return build_tiny_vision_model(tmp_path_factory.mktemp("tiny-vision"))


@pytest.fixture(scope="session")
def tiny_text_loaded(tiny_text_dir: Path) -> LoadedModel:
    from wschat.server.engine.local.loader import load_model

    return load_model(str(tiny_text_dir), dtype="float32")


def packed_precisions_here() -> list[str]:
    """The packed ``--dtype`` names this machine's CPU and torch build run."""
    from wschat.server.engine.local.precision import PACKED, packing_unavailable

    runnable = PACKED.items()
    return [name for name, (_, packing, *_) in runnable if not packing_unavailable(packing, "cpu")]


@pytest.fixture(scope="session", params=packed_precisions_here())
def tiny_text_packed(request: pytest.FixtureRequest, tiny_text_dir: Path) -> LoadedModel:
    """The tiny text model loaded with each packed precision this machine runs."""
    from wschat.server.engine.local.loader import load_model

    return load_model(str(tiny_text_dir), dtype=request.param)


@pytest.fixture(scope="session")
def tiny_vision_loaded(tiny_vision_dir: Path) -> LoadedModel:
    from wschat.server.engine.local.loader import load_model

    return load_model(str(tiny_vision_dir), dtype="float32")


@pytest.fixture
async def tiny_text_engine(tiny_text_loaded: LoadedModel) -> AsyncIterator[HFEngine]:
    """A fresh engine (its own KV store) over the session's loaded tiny text model."""
    from wschat.server.engine.local.hf import HFEngine

    engine = HFEngine(tiny_text_loaded)
    yield engine
    await engine.aclose()


@pytest.fixture
async def tiny_vision_engine(tiny_vision_loaded: LoadedModel) -> AsyncIterator[HFEngine]:
    from wschat.server.engine.local.hf import HFEngine

    engine = HFEngine(tiny_vision_loaded)
    yield engine
    await engine.aclose()


@pytest.fixture(scope="session")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """One llama.cpp server for the whole run; a test that kills it starts it again."""
    from tests.openai.llama import llama_server

    log = tmp_path_factory.mktemp("llama") / "llama.log"
    with llama_server(free_port(), log) as server:
        yield server


@pytest.fixture
def live_llama(llama: LlamaServer) -> LlamaServer:
    if llama.process is None or llama.process.poll() is not None:
        llama.start()  # a test before this one stopped it
    return llama


@pytest.fixture(scope="session")
def connected_openai(llama: LlamaServer) -> OpenAIEngine:
    """The openai engine in front of ``llama``, connected once: loading its tokenizer takes
    seconds. Each test's ``openai_engine`` closes its HTTP client after it (a client belongs to
    one event loop); the next use opens another."""
    from wschat.server.engine.openai import connect

    return connect(llama.config())


@pytest.fixture
async def openai_engine(
    live_llama: LlamaServer, connected_openai: OpenAIEngine
) -> AsyncIterator[OpenAIEngine]:
    try:
        yield connected_openai
    finally:
        await connected_openai.aclose()
