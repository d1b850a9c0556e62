"""llama.cpp's output relayed to our log (``server/runtime/llamacpp_output.py``, read by
``supervisor.py``): line by line whichever of its two streams a line came on, and its
known-harmless warnings at debug level."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest
from wschat.server.engine.embedded import default_cache_dir
from wschat.server.runtime.llamacpp_output import HARMLESS
from wschat.server.runtime.supervisor import LlamaCppConfig, LlamaCppServer, launch

from tests.openai.llama import SLOT_CONTEXT, SLOTS, START_TIMEOUT
from tests.support import raw_peer, running_server

LOGGER = "wschat.engine.llamacpp"
LAUNCH_TIMEOUT = START_TIMEOUT + 30.0

# A healthy child whose launcher says where it listens in two writes to stdout, with a llama.cpp
# log line written to stderr between them: the order the issue saw, when the two writers' bytes
# met in one pipe ("...:8080I srv  init: ...").
GLUED_CHILD = """
import http.server, os, threading
class Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
httpd = http.server.HTTPServer(("127.0.0.1", 0), Healthy)
threading.Thread(target=httpd.serve_forever, daemon=True).start()
os.write(1, f"listening on http://127.0.0.1:{httpd.server_port}".encode())
os.write(2, b"0.01.206.038 I srv          init: model loaded\\n")
os.write(1, b"\\n")
while os.read(0, 4096):
    pass
"""


def config(start_timeout_s: float = START_TIMEOUT) -> LlamaCppConfig:
    return LlamaCppConfig(
        model="embedded",
        cache_dir=default_cache_dir(),
        threads=1,
        slots=SLOTS,
        slot_context=SLOT_CONTEXT,
        start_timeout_s=start_timeout_s,
    )


class GluedChild(LlamaCppServer):
    """A supervisor whose child is ``GLUED_CHILD``."""

    def __init__(self) -> None:
        super().__init__(config(start_timeout_s=5.0))

    def _command(self) -> list[str]:
        return [sys.executable, "-c", GLUED_CHILD]


def test_the_launchers_line_and_llama_cpps_are_read_apart_when_their_writes_interleave(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    server = GluedChild()
    try:
        url = server.start()
    finally:
        server.stop()
    assert url.rsplit(":", 1)[1].isdigit(), url
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert "llama.cpp: srv init: model loaded" in lines, lines


async def test_its_known_harmless_warnings_reach_our_log_at_debug_and_no_other_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    async with asyncio.timeout(LAUNCH_TIMEOUT):
        engine = await asyncio.to_thread(launch, config(), tokenizer=None, prompt_format="auto")
    try:
        async with running_server(engine) as url, raw_peer(url) as (peer, _):
            await peer.send(
                {"type": "prompt", "id": "a", "text": "Hi", "params": {"max_new_tokens": 4}}
            )
            assert (await peer.recv_until("done"))[-1]["reason"] in ("stop", "length")
    finally:
        await engine.aclose()
    records = [r for r in caplog.records if r.name == LOGGER]
    warnings = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    assert warnings == [], warnings
    harmless = [r for r in records if any(mark in r.getMessage() for mark in HARMLESS)]
    said = {mark for mark in HARMLESS for r in harmless if mark in r.getMessage()}
    # the two a start always logs (a cancel's is not made here)
    assert {"this is probably a bug in the model", "using full-size SWA cache"} <= said
    assert {r.levelno for r in harmless} == {logging.DEBUG}
