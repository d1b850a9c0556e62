"""The gateway runs without torch and transformers: ``wschat-server --engine openai`` in a
process where importing them (or accelerate) fails, serving a chat from llama.cpp's server."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.openai.llama import LlamaServer
from tests.support import ROOT, command_until_ready, free_port, raw_peer

BLOCKED = ("torch", "transformers", "accelerate")
_PRELUDE = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is not installed (blocked by the test)")
sys.meta_path.insert(0, Block())
from wschat.server.runtime.cli import main
status = main(sys.argv[1:])
assert not [m for m in sys.modules if m.partition(".")[0] in BLOCKED]
sys.exit(status)
"""


async def test_the_gateway_serves_a_chat_with_torch_and_transformers_unimportable(
    live_llama: LlamaServer, tmp_path: Path
) -> None:
    port = free_port()
    command = [
        sys.executable,
        "-c",
        _PRELUDE.format(blocked=BLOCKED),
        "--engine",
        "openai",
        "--engine-url",
        live_llama.api_url,
        "--tokenizer",
        "embedded",
        "--port",
        str(port),
        "--ping-interval-s",
        "0",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = tmp_path / "gateway.log"
    url = f"ws://127.0.0.1:{port}/v1/chat"
    async with (
        command_until_ready(command, port, log, env, 120.0, cwd=ROOT),
        raw_peer(url) as (peer, ready),
    ):
        await peer.send({"type": "prompt", "id": "a", "text": "What is the capital of France?"})
        frames = await peer.recv_until("done")
    assert ready["engine"] == "openai"
    assert frames[-1]["reason"] in ("stop", "length") and frames[-1]["text"]
    assert "blocked by the test" not in log.read_text()
