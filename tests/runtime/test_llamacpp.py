"""The launcher of llama.cpp's server (``python -m wschat.server.runtime.llamacpp``, as
docs/deploy.md and docker-compose.yml run it): its ``--help`` says what it runs and every
default, and it serves the model under a short name, not the GGUF's path."""

from __future__ import annotations

import httpx
from wschat.server.engine.openai import OpenAIEngine
from wschat.server.runtime.llamacpp import EMBEDDED_ALIAS, build_parser, model_alias

from tests.openai.llama import LlamaServer
from tests.support import TIMEOUT


def test_the_help_says_what_it_runs_and_every_default() -> None:
    text = " ".join(build_parser().format_help().split())  # argparse wraps at the terminal
    assert "llama.cpp's server" in text and "GGUF" in text
    for default in (
        "--port PORT listening port (0 picks a free one) (default: 8080)",
        "(default: 127.0.0.1)",
        "(default: 8192)",
        f"(default: {EMBEDDED_ALIAS} for the embedded model",
    ):
        assert default in text, default
    assert "$WSCHAT_CACHE_DIR" in text  # as wschat-server and Dockerfile.gateway read it
    assert "(default: None)" not in text  # each default said in words where it has no value


def test_a_gguf_file_is_served_under_its_stem() -> None:
    assert model_alias("/models/gemma-3-4b-it-Q4_K_M.gguf") == "gemma-3-4b-it-Q4_K_M"
    assert model_alias("embedded") == EMBEDDED_ALIAS


def test_the_embedded_model_is_served_and_greeted_under_its_alias(
    live_llama: LlamaServer, openai_engine: OpenAIEngine
) -> None:
    models = httpx.get(f"{live_llama.api_url}/models", timeout=TIMEOUT).json()
    assert [model["id"] for model in models["data"]] == [EMBEDDED_ALIAS]
    assert openai_engine.model == EMBEDDED_ALIAS  # the name the ready frame gives
