"""What reaches the server's log: a gateway (``wschat-server --engine openai``, a process of its
own) in front of an engine of the test's own whose every generation fails with a 500 that echoes
our API key and the header it came in. The key must not reach the log, and a prompt id with a
line break in it must not start a log line of its own."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from wschat.protocol import MODEL_LOADING_REASON, CloseCode

from tests.support import (
    ROOT,
    TIMEOUT,
    closed_before_ready,
    command_until_ready,
    free_port,
    raw_peer,
    wait_ready,
)

START_TIMEOUT = 120.0  # a process of its own imports the server first: slow on a busy machine

API_KEY = "sk-test-0123456789abcdef"
FORGED = "2026-01-01 00:00:00,000 ERROR wschat.app: not ours"  # fits an id: 64
MODELS = {"data": [{"id": "echo", "owned_by": "vllm", "max_model_len": 4096}]}


class _EchoingEngine(BaseHTTPRequestHandler):
    """An OpenAI-compatible engine that lists one model and fails every request it is sent,
    quoting the key and the Authorization header back in its error."""

    def do_GET(self) -> None:
        self._answer(200, MODELS if self.path == "/v1/models" else {})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/tokenize":
            self._answer(404, {"error": {"message": "no such route"}})
            return
        said = f"invalid key {API_KEY} (sent as {self.headers['Authorization']})"
        self._answer(500, {"error": {"message": said}})

    def _answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass  # the test reads the gateway's log, not this one


@contextlib.contextmanager
def echoing_engine() -> Iterator[str]:
    """The engine on a free loopback port; yields its API base."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoingEngine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(TIMEOUT)


async def test_an_engine_error_echoing_our_key_and_a_prompt_id_with_a_line_break_log_safely(
    tmp_path: Path,
) -> None:
    port = free_port()
    log = tmp_path / "gateway.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WSCHAT_ENGINE_API_KEY": API_KEY}
    with echoing_engine() as engine_url:
        options = f"--engine openai --engine-url {engine_url} --tokenizer embedded --port {port}"
        command = [sys.executable, "-m", "wschat.server", *options.split(), "--ping-interval-s=0"]
        async with (
            command_until_ready(command, port, log, env, 120.0, cwd=ROOT),
            raw_peer(f"ws://127.0.0.1:{port}/v1/chat") as (peer, _),
        ):
            prompt_id = f"p\n{FORGED}"
            await peer.send({"type": "prompt", "id": prompt_id, "text": "hello"})
            frames = await peer.recv_until("done")
            assert [f["type"] for f in frames[-2:]] == ["error", "done"]
            assert frames[-1]["reason"] == "error"
    text = log.read_text()
    failure = [line for line in text.splitlines() if "generation p" in line]
    assert len(failure) == 1, text
    assert "p\\n2026-01-01" in failure[0]  # the id, its line break escaped
    assert "invalid key … (sent as Bearer …)" in failure[0]
    assert API_KEY not in text
    assert not any(line.startswith(FORGED) for line in text.splitlines())


async def test_a_client_waiting_for_the_model_is_one_line_not_two_a_connection(
    tmp_path: Path,
) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    command = [sys.executable, "-m", "tests.hardening.scripted_server", str(port), "--hold-load"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=sink, env=env, cwd=ROOT)
    try:
        await wait_ready(process, port, log, START_TIMEOUT, path="/healthz")
        for _ in range(5):  # as a waiting client reconnects
            closed = await closed_before_ready(f"ws://127.0.0.1:{port}/v1/chat")
            assert closed == (CloseCode.TRY_AGAIN_LATER, MODEL_LOADING_REASON)
    finally:
        process.kill()  # its model never loads: nothing to drain
        process.wait(TIMEOUT)
    lines = log.read_text().splitlines()
    waiting = [line for line in lines if "waits for the model" in line]
    assert waiting == [
        "INFO:wschat.admission:a client at 127.0.0.1 waits for the model to load "
        "(closed with 1013 until then)"
    ]
    per_connection = ("[accepted]", "connection open", "connection closed")
    assert [line for line in lines if any(said in line for said in per_connection)] == []


@pytest.mark.parametrize("level", ["info", "debug"])
async def test_a_gateway_logs_its_engine_requests_and_health_checks_only_at_debug(
    tmp_path: Path, level: str
) -> None:
    port = free_port()
    log = tmp_path / "gateway.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with echoing_engine() as engine_url:
        options = f"--engine openai --engine-url {engine_url} --tokenizer embedded --port {port}"
        command = [sys.executable, "-m", "wschat.server", *options.split(), "--log-level", level]
        async with (
            command_until_ready(command, port, log, env, 120.0, cwd=ROOT),
            httpx.AsyncClient(timeout=TIMEOUT) as http,
        ):
            for _ in range(2):  # as a load balancer checks
                assert (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
    requests = [line for line in log.read_text().splitlines() if "HTTP Request:" in line]
    if level == "info":
        assert requests == []
    else:  # the engine's model list at start, and a health check
        assert requests and all(" DEBUG httpx: HTTP Request: " in line for line in requests)
        assert any("GET " + engine_url.removesuffix("/v1") + "/health" in r for r in requests)
