"""The README's example of the Responses API's WebSocket mode, run as written (but for the
server's address and its token) against a real uvicorn: two turns on one socket, the second
continuing the first from the KV state the socket kept."""

from __future__ import annotations

import re
import sys

from tests.fakes.scripted import ScriptedEngine
from tests.readme import README
from tests.support import TIMEOUT, http_base, run_to_exit, running_server

MARKER = "<!-- responses example: tests/api/test_responses_readme.py runs it as written -->"


def readme_example() -> str:
    text = README.read_text()
    assert MARKER in text, f"the README lost the marker {MARKER}"
    block = re.search(r"```python\n(.*?)\n```", text.split(MARKER, 1)[1], re.DOTALL)
    assert block is not None
    return block.group(1)


async def test_the_readmes_websocket_example_runs_two_turns() -> None:
    example = readme_example()
    async with running_server(ScriptedEngine(), tokens=("YOUR_TOKEN",)) as url:
        code = example.replace("http://127.0.0.1:8000", http_base(url))
        status, out, err = await run_to_exit([sys.executable, "-c", code], timeout=TIMEOUT)
    assert status == 0, err
    assert out.splitlines() == [
        " w0 w1 w2 w3 w4 w5 w6 w7",
        "[0 cached]",
        " w0 w1 w2 w3 w4 w5 w6 w7",
        "[0 cached]",
    ]
