"""The client's exceptions for ``error`` frames are the protocol's classes of their codes
(``client/errors.py`` takes them from ``protocol/errors.py``), under the client's own names."""

from __future__ import annotations

import asyncio

import pytest
import wschat.client
from wschat.client import BusyError, ChatError, ClientError, connect, error_from_frame
from wschat.protocol import Busy, Error, ErrorCode, FinishReason, ProtocolError

from tests.client.engines import WAIT, slow_engine
from tests.support import running_server

WIRE_CLASSES = {
    cls.code: cls
    for cls in ProtocolError.__subclasses__()
    if cls.__module__ == ProtocolError.__module__
}


@pytest.mark.parametrize("code", list(ErrorCode), ids=[code.value for code in ErrorCode])
def test_each_error_frame_raises_the_client_class_that_is_the_protocols_class_of_its_code(
    code: ErrorCode,
) -> None:
    error = error_from_frame(Error(code, "refused", id="p1"))
    wire = WIRE_CLASSES[code]
    assert isinstance(error, wire) and isinstance(error, ChatError)
    assert isinstance(error, ClientError)
    assert type(error) is getattr(wschat.client, f"{wire.__name__}Error")
    assert (error.code, error.message, error.id) == (code, "refused", "p1")
    assert str(error) == f"{code.value}: refused"
    assert repr(error) == f"{wire.__name__}Error(code={code.value!r}, message='refused')"


def test_a_chat_error_built_with_a_code_keeps_it_and_its_class_keeps_its_own() -> None:
    error = ChatError("full", code=ErrorCode.OVERLOADED)
    assert (error.code, error.id, str(error)) == (ErrorCode.OVERLOADED, None, "overloaded: full")
    assert ChatError.code is ErrorCode.INTERNAL and ChatError("x").code is ErrorCode.INTERNAL


async def test_a_busy_refusal_from_the_server_is_caught_as_the_protocols_busy() -> None:
    async with running_server(slow_engine()) as url, connect(url, timeout=WAIT) as chat:
        first = chat.prompt("go", max_new_tokens=20)
        async with asyncio.timeout(WAIT):
            await anext(first)  # it runs
        second = chat.prompt("too soon")
        with pytest.raises(Busy) as refused:
            await second.wait(WAIT)
        assert type(refused.value) is BusyError and refused.value.id == second.id
        assert (await first.wait(WAIT)).reason is FinishReason.LENGTH
