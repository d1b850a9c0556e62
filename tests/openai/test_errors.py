"""An engine's HTTP failures as the engine's own failure classes: the engine's words kept for the
log (``detail``), a message written for clients, and a retry hint when it is busy."""

from __future__ import annotations

import json

import pytest
from wschat.server.engine.errors import ContextExhausted, EngineFailed, EngineOverloaded
from wschat.server.engine.openai.errors import MAX_RETRY_S, failure_from_status, lost


def _body(message: str) -> bytes:
    return json.dumps({"error": {"type": "invalid_request_error", "message": message}}).encode()


@pytest.mark.parametrize(
    "said",
    [
        "the request exceeds the available context size (exceed_context_size_error)",
        "This model's maximum context length is 512 tokens.",
        # SGLang's two words for it
        "The input (9000 tokens) is longer than the model's context length (8192 tokens).",
        "Requested token count exceeds the model's maximum context length of 8192 tokens.",
    ],
)
def test_a_400_about_the_context_is_context_exhausted(said: str) -> None:
    failure = failure_from_status(400, _body(said))
    assert isinstance(failure, ContextExhausted)
    assert said not in failure.message and said in failure.detail


@pytest.mark.parametrize("status", [429, 503])
def test_a_busy_engine_is_overloaded_with_the_retry_after_it_gave(status: int) -> None:
    failure = failure_from_status(status, b"slots full", retry_after="3")
    assert isinstance(failure, EngineOverloaded)
    assert failure.retry_s == 3.0 and "retry in 3 s" in failure.message
    assert "slots full" not in failure.message and "slots full" in failure.detail


def test_any_other_status_is_engine_failed_and_keeps_the_body_out_of_the_message() -> None:
    failure = failure_from_status(500, _body("CUDA error at /opt/llama/ggml.c:42"))
    assert isinstance(failure, EngineFailed)
    assert "/opt/llama" not in failure.message and "/opt/llama" in failure.detail
    assert isinstance(lost("connection reset"), EngineFailed)


@pytest.mark.parametrize(
    ("header", "seconds"), [("1e30", MAX_RETRY_S), ("inf", MAX_RETRY_S), ("nan", 1.0), ("-5", 0.0)]
)
def test_a_retry_after_out_of_range_is_bounded(header: str, seconds: float) -> None:
    failure = failure_from_status(503, b"busy", retry_after=header)
    assert isinstance(failure, EngineOverloaded) and failure.retry_s == seconds
