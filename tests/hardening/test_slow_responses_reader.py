"""A Responses WebSocket-mode client that stops reading (web/responses/socket.py): the events of
its response are sent from the generation's task, which waits on the socket as a chat socket's
frames do, so the text that waits comes in fewer, merged ``response.output_text.delta`` events
and none of it is lost."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import websockets

from tests.fakes.scripted import Script, ScriptedEngine
from tests.hardening.test_slow_reader import loop_caught_up
from tests.support import TIMEOUT, running_server, small_buffer_socket, wait_until

TOKENS = 20_000


async def test_a_stalled_responses_reader_gets_all_text_in_merged_deltas() -> None:
    engine = ScriptedEngine(lambda request: Script([f" t{i}" for i in range(TOKENS)]))
    expected = "".join(f" t{i}" for i in range(TOKENS))
    async with running_server(engine, max_new_tokens=TOKENS) as url, asyncio.timeout(TIMEOUT):
        where = url.replace("/v1/chat", "/v1/responses")
        async with websockets.connect(where, sock=small_buffer_socket(url), max_size=None) as ws:
            create = {"type": "response.create", "model": "any", "input": "go"}
            await ws.send(json.dumps({**create, "max_output_tokens": TOKENS}))
            events: list[dict[str, Any]] = []
            while not events or events[-1]["type"] != "response.output_text.delta":
                events.append(json.loads(await ws.recv()))
            ws.transport.pause_reading()  # socket buffers fill up, then the generation waits
            await wait_until(lambda: not engine.threads)  # every token produced meanwhile
            await loop_caught_up()
            ws.transport.resume_reading()
            while events[-1]["type"] != "response.completed":
                events.append(json.loads(await ws.recv()))
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(deltas) == expected, "text was lost"
    assert len(deltas) < TOKENS / 10  # what waited came merged, not an event per token
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert done["text"] == expected
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
