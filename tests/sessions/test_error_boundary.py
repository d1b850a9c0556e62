"""Where an exception becomes an ``error`` frame (``error_frame``), the one class per wire code,
an engine's errors under the codes the table gives them, and the ``Outbox`` that counts every
``error`` it sends."""

from __future__ import annotations

import pytest
import wschat.protocol.errors as errors
from wschat.protocol import (
    Busy,
    Error,
    ErrorCode,
    Frame,
    Internal,
    Overloaded,
    Pong,
    ProtocolError,
    SessionMisuse,
)
from wschat.server.engine import errors as engine_errors
from wschat.server.engine.errors import (
    ContextExhausted,
    ConversationTooLong,
    EngineError,
    EngineFailed,
    EngineOverloaded,
    GenerationFailure,
    ImagesUnsupported,
    PromptTooLong,
    SchemaRefused,
)
from wschat.server.sessions.error_boundary import (
    ENGINE_ERRORS,
    GENERIC_MESSAGE,
    Outbox,
    error_frame,
    expected,
)


def test_a_protocol_error_keeps_its_code_message_and_own_id() -> None:
    assert error_frame(Busy("busy now", id="p1"), "other") == Error(
        ErrorCode.BUSY, "busy now", "p1"
    )
    assert error_frame(Overloaded("full"), "p2") == Error(ErrorCode.OVERLOADED, "full", "p2")


def test_a_bug_or_our_misuse_is_internal_with_a_generic_message() -> None:
    for bug in (KeyError("/srv/secret"), SessionMisuse("idle: slot granted")):
        assert error_frame(bug, "p") == Error(ErrorCode.INTERNAL, GENERIC_MESSAGE, "p")


def test_the_base_class_has_no_code_and_cannot_be_raised() -> None:
    assert not hasattr(ProtocolError, "code")
    with pytest.raises(TypeError):
        ProtocolError("which code?")
    assert not issubclass(SessionMisuse, ProtocolError)


def test_each_wire_code_the_server_raises_has_exactly_one_class() -> None:
    classes = [
        c
        for c in vars(errors).values()
        if isinstance(c, type) and issubclass(c, ProtocolError) and c is not ProtocolError
    ]
    codes = [c.code for c in classes]
    assert len(codes) == len(set(codes))
    assert set(codes) == set(ErrorCode)


async def test_the_outbox_counts_each_error_frame_by_code_and_sends_every_frame() -> None:
    sent: list[Frame] = []
    counted: list[ErrorCode] = []

    async def send(frame: Frame) -> None:
        sent.append(frame)

    outbox = Outbox(send, counted.append)
    await outbox(Pong(1))
    await outbox.error(Internal("generation failed"), "g")
    await outbox.error(ValueError("a bug"))
    assert counted == [ErrorCode.INTERNAL, ErrorCode.INTERNAL]
    assert sent == [
        Pong(1),
        Error(ErrorCode.INTERNAL, "generation failed", "g"),
        Error(ErrorCode.INTERNAL, GENERIC_MESSAGE, None),
    ]


def _leaves(root: type[EngineError]) -> set[type[EngineError]]:
    subclasses = root.__subclasses__()
    return set().union(*map(_leaves, subclasses)) if subclasses else {root}


def test_every_engine_error_has_its_wire_code_in_the_table() -> None:
    leaves = {kind for kind in _leaves(EngineError) if kind.__module__ == engine_errors.__name__}
    assert leaves == {kind for kind, _ in ENGINE_ERRORS}
    assert {
        kind: error_frame(kind("said for the peer"), "p").code
        for kind in (
            ContextExhausted,
            ConversationTooLong,
            EngineFailed,
            ImagesUnsupported,
            PromptTooLong,
            SchemaRefused,
        )
    } == {
        ContextExhausted: ErrorCode.CONTEXT_OVERFLOW,
        ConversationTooLong: ErrorCode.CONTEXT_OVERFLOW,
        EngineFailed: ErrorCode.INTERNAL,
        ImagesUnsupported: ErrorCode.UNSUPPORTED,
        PromptTooLong: ErrorCode.TOO_LARGE,
        SchemaRefused: ErrorCode.INVALID_PARAMS,
    }


def test_an_engine_error_sends_its_message_and_never_its_detail() -> None:
    busy = EngineOverloaded("busy; retry in 2 s", retry_s=2.0, detail="HTTP 503: slot 3 of /srv")
    assert error_frame(busy, "p") == Error(ErrorCode.OVERLOADED, "busy; retry in 2 s", "p")
    assert "/srv" in str(busy)  # the log line has it
    assert expected(busy) and expected(PromptTooLong("too long"))
    assert not expected(KeyError("bug"))


def test_an_engine_error_missing_from_the_table_is_internal_with_a_generic_message() -> None:
    class Unmapped(GenerationFailure):
        pass

    assert error_frame(Unmapped("private words"), "p") == Error(
        ErrorCode.INTERNAL, GENERIC_MESSAGE, "p"
    )
