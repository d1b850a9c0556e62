"""``--engine llamacpp`` (``runtime/supervisor.py``): a real llama.cpp server as wschat's
child on the embedded GGUF, a real server in front and a real WebSocket client. Killed mid-reply
it is restarted; it stops with the server and with a parent that dies; a start that cannot
succeed ends with llama.cpp's reason, once."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from wschat.server.engine.embedded import default_cache_dir
from wschat.server.engine.openai import OpenAIEngine
from wschat.server.engine.openai.client import EngineHttp
from wschat.server.runtime.supervisor import (
    FIRST_RETRY_S,
    MAX_RETRY_S,
    LlamaCppConfig,
    LlamaCppError,
    LlamaCppServer,
    checked_gguf,
    launch,
    retry_delay,
)

from tests.openai.llama import SLOT_CONTEXT, SLOTS, START_TIMEOUT
from tests.support import ROOT, TIMEOUT, http_base, raw_peer, running_server, wait_until

LONG = "Write the numbers from 1 to 200 separated by spaces."
STOP_TIMEOUT = 30.0
# past the child's own start deadline, so that a start that fails says why (LlamaCppError)
LAUNCH_TIMEOUT = START_TIMEOUT + 30.0


def config(**overrides: Any) -> LlamaCppConfig:
    values: dict[str, Any] = {
        "model": "embedded",
        "cache_dir": default_cache_dir(),
        "threads": 1,
        "slots": SLOTS,
        "slot_context": SLOT_CONTEXT,
        "start_timeout_s": START_TIMEOUT,
        **overrides,
    }
    return LlamaCppConfig(**values)


def gone(pid: int) -> bool:
    """No such process, or one that exited and waits for a parent to reap it."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def kill(pid: int | None) -> None:
    if pid is not None and not gone(pid):
        os.kill(pid, signal.SIGKILL)


def server_of(engine: OpenAIEngine) -> LlamaCppServer:
    assert isinstance(engine.child, LlamaCppServer)
    return engine.child


@pytest.fixture
async def llamacpp_engine() -> AsyncIterator[OpenAIEngine]:
    """``--engine llamacpp``'s engine on a fresh child; closed (the child stopped) after."""
    async with asyncio.timeout(LAUNCH_TIMEOUT):
        engine = await asyncio.to_thread(launch, config(), tokenizer=None, prompt_format="auto")
    pid = server_of(engine).pid
    try:
        yield engine
    finally:
        async with asyncio.timeout(STOP_TIMEOUT):
            await engine.aclose()
        kill(pid)  # only if the test failed before the child was stopped


async def prompt(peer: Any, frame_id: str, text: str, **params: Any) -> list[dict[str, Any]]:
    await peer.send({"type": "prompt", "id": frame_id, "text": text, "params": params})
    frames: list[dict[str, Any]] = await peer.recv_until("done")
    return frames


async def test_a_started_server_serves_a_chat_logs_through_ours_and_stops_with_the_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="wschat.engine.llamacpp")
    async with asyncio.timeout(LAUNCH_TIMEOUT):
        engine = await asyncio.to_thread(launch, config(), tokenizer=None, prompt_format="auto")
    child = server_of(engine)
    pid = child.pid
    assert pid is not None and not gone(pid)
    try:
        async with running_server(engine) as url, raw_peer(url) as (peer, ready):
            frames = await prompt(peer, "a", "What is the capital of France?", max_new_tokens=8)
            async with httpx.AsyncClient(timeout=5) as http:
                headers = {"Authorization": f"Bearer {child.api_key}"}
                slots = (await http.get(f"{child.url}/slots", headers=headers)).json()
                refused = await http.get(f"{child.url}/slots")  # another local user's request
        # the server's lifespan closed the engine: the child is stopped, by its pid
        await wait_until(lambda: gone(pid), timeout=STOP_TIMEOUT)
    finally:
        kill(pid)
    assert ready["engine"] == "llamacpp" and ready["limits"]["context_tokens"] == SLOT_CONTEXT
    assert frames[-1]["type"] == "done" and frames[-1]["text"]
    assert len(slots) == SLOTS and refused.status_code == 401
    lines = [r.getMessage() for r in caplog.records if r.name == "wschat.engine.llamacpp"]
    assert any(m.startswith("llama.cpp: srv") and "loading model" in m for m in lines), lines
    assert f"llama.cpp's server (pid {pid}) stopped: exit status 0" in lines


async def test_a_server_killed_mid_reply_ends_it_in_error_and_is_restarted_and_serving(
    llamacpp_engine: OpenAIEngine,
) -> None:
    child = server_of(llamacpp_engine)
    first_pid, first_url = child.pid, child.url
    assert first_pid is not None
    async with running_server(llamacpp_engine) as url, raw_peer(url) as (peer, _):
        await peer.send(
            {"type": "prompt", "id": "a", "text": LONG, "params": {"max_new_tokens": 400}}
        )
        await peer.recv_until("token")
        os.kill(first_pid, signal.SIGKILL)
        frames = await peer.recv_until("done")
        # until the new child is healthy, prompts find no engine
        refused = await prompt(peer, "b", "Hello?")
        await wait_until(lambda: child.pid != first_pid, timeout=START_TIMEOUT, interval=0.05)
        async with httpx.AsyncClient(timeout=5) as http, asyncio.timeout(START_TIMEOUT):
            while (await http.get(f"{http_base(url)}/readyz")).status_code != 200:
                await asyncio.sleep(0.1)  # readyz asks the engine at most once a second
        again = await prompt(peer, "c", "What is the capital of France?", max_new_tokens=8)
        moved_to = child.url
    errors = [f["code"] for f in frames if f["type"] == "error"]
    assert errors == ["internal"] and frames[-1]["reason"] == "error"
    assert [f["code"] for f in refused if f["type"] == "error"] == ["overloaded"]
    assert gone(first_pid) and moved_to != first_url  # a new process on a port of its own
    assert llamacpp_engine.http.root_url == moved_to
    assert again[-1]["reason"] in ("stop", "length") and again[-1]["text"]


def test_a_port_it_cannot_bind_fails_the_start_with_llama_cpps_reason() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = LlamaCppServer(config(port=port))
        with pytest.raises(LlamaCppError, match=f"couldn't bind HTTP server socket.*{port}"):
            server.start()
    assert server.pid is None  # no child kept, none restarting


# A child that says where it listens and then answers /health with 503 until its stdin closes.
UNHEALTHY_CHILD = """
import http.server, os, sys, threading
class Busy(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(503)
        self.end_headers()
    def log_message(self, *args):
        pass
httpd = http.server.HTTPServer(("127.0.0.1", 0), Busy)
threading.Thread(target=httpd.serve_forever, daemon=True).start()
print(f"listening on http://127.0.0.1:{httpd.server_port}", flush=True)
while os.read(0, 4096):
    pass
"""
# A child that says where it listens only in llama.cpp's own log line, then is healthy.
HEALTHY_CHILD = UNHEALTHY_CHILD.replace("503", "200").replace(
    'print(f"listening', 'print(f"0.01.339.042 listening'
)
SILENT_CHILD = "import os\nwhile os.read(0, 4096):\n    pass\n"


class ScriptedChild(LlamaCppServer):
    """A supervisor whose child is a Python script of the test's own."""

    def __init__(self, script: str, *args: str) -> None:
        super().__init__(config(start_timeout_s=2.0))
        self.script = script
        self.args = args

    def _command(self) -> list[str]:
        return [sys.executable, "-c", self.script, *self.args]


@pytest.mark.parametrize(
    ("script", "said"),
    [
        (UNHEALTHY_CHILD, r"\(listening on http://127\.0\.0\.1:\d+; /health answered 503\)"),
        (SILENT_CHILD, r"\(it never said where it listens\)"),
    ],
)
def test_a_start_that_times_out_says_how_far_the_child_got(script: str, said: str) -> None:
    server = ScriptedChild(script)
    with pytest.raises(LlamaCppError, match=r"not ready within 2 s " + said):
        server.start()
    assert server.pid is None  # the child was stopped, none restarting


def test_the_child_is_found_by_llama_cpps_own_listening_line() -> None:
    server = ScriptedChild(HEALTHY_CHILD)
    try:
        server.start()
        assert server.pid is not None
    finally:
        server.stop()
    assert server.pid is None


def test_a_file_that_is_not_a_gguf_is_refused_before_anything_starts(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"PK\x03\x04 a zip, not a model")
    with pytest.raises(LlamaCppError, match=r"model\.gguf is not a GGUF file"):
        LlamaCppServer(config(model=str(model)))
    with pytest.raises(LlamaCppError, match="no file at"):
        checked_gguf(str(tmp_path / "missing.gguf"))


@pytest.mark.parametrize(("level", "verbosity"), [(logging.INFO, "2"), (logging.DEBUG, "3")])
def test_its_info_lines_are_asked_for_only_where_our_log_keeps_debug_lines(
    caplog: pytest.LogCaptureFixture, level: int, verbosity: str
) -> None:
    # five lines a request, each waking the thread that reads them
    caplog.set_level(level, logger="wschat.engine.llamacpp")
    command = LlamaCppServer(config())._command()
    assert command[command.index("--verbosity") + 1] == verbosity


def test_restarts_back_off_from_half_a_second_to_thirty() -> None:
    delays = [retry_delay(n) for n in range(10)]
    assert delays[:3] == [FIRST_RETRY_S, 2 * FIRST_RETRY_S, 4 * FIRST_RETRY_S]
    assert delays == sorted(delays) and delays[-1] == MAX_RETRY_S == 30.0
    assert retry_delay(10_000) == MAX_RETRY_S


# A healthy child the first time it starts; every later start exits at once (a marker file says
# which start it is), so that every restart fails.
ONCE_HEALTHY_CHILD = (
    "import os, sys\n"
    "marker = sys.argv[1]\n"
    "if os.path.exists(marker):\n"
    "    sys.exit(1)\n"
    "open(marker, 'w').close()\n"
) + HEALTHY_CHILD


def restart_delays(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The delay each logged restart waits, as logged: ``restarting in`` after a death,
    ``again in`` after a failed restart."""
    lines = [r.getMessage() for r in caplog.records if r.name == "wschat.engine.llamacpp"]
    return [line.rsplit(" in ", 1)[1] for line in lines if " in " in line and "restart" in line]


async def test_each_death_of_a_child_that_became_healthy_restarts_after_half_a_second(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="wschat.engine.llamacpp")
    server = ScriptedChild(HEALTHY_CHILD)
    urls: list[str] = []
    server.start()
    server.supervise(on_url=urls.append)
    try:
        for _ in range(3):
            pid, restarted = server.pid, len(urls) + 1
            kill(pid)  # each child killed once it is healthy: within a second of the last
            await wait_until(lambda n=restarted: len(urls) == n, timeout=TIMEOUT, interval=0.02)
            assert server.pid != pid
    finally:
        server.stop()
    assert restart_delays(caplog) == ["0.5 s", "0.5 s", "0.5 s"]


async def test_restarts_that_fail_double_the_delay(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.INFO, logger="wschat.engine.llamacpp")
    server = ScriptedChild(ONCE_HEALTHY_CHILD, str(tmp_path / "started"))
    server.start()
    server.supervise(on_url=lambda url: None)
    try:
        kill(server.pid)
        await wait_until(lambda: len(restart_delays(caplog)) >= 3, timeout=TIMEOUT)
    finally:
        server.stop()
    assert restart_delays(caplog)[:3] == ["0.5 s", "1.0 s", "2.0 s"]


def test_the_client_follows_a_server_that_moved() -> None:
    http = EngineHttp("http://127.0.0.1:1/v1", "key")
    http.move_to("http://127.0.0.1:2")
    assert (http.api_url, http.root_url) == ("http://127.0.0.1:2/v1", "http://127.0.0.1:2")


# -- processes of their own: a parent that dies, wschat-server itself ---------------------------

_PARENT = """
import sys
from wschat.server.runtime.supervisor import LlamaCppConfig, LlamaCppServer
from wschat.server.engine.embedded import default_cache_dir
server = LlamaCppServer(LlamaCppConfig("embedded", default_cache_dir(), 1, 1, 512))
server.start()
print(server.pid, flush=True)
sys.stdin.read()  # until the test kills this process
"""


@pytest.fixture
def parent() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", _PARENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait(TIMEOUT)
        for pipe in (process.stdin, process.stdout):
            assert pipe is not None
            pipe.close()


async def test_the_child_stops_by_itself_when_its_parent_is_killed(
    parent: subprocess.Popen[str],
) -> None:
    assert parent.stdout is not None
    async with asyncio.timeout(START_TIMEOUT):
        pid = int(await asyncio.to_thread(parent.stdout.readline))
    try:
        assert not gone(pid)
        parent.kill()  # SIGKILL: nothing of the parent runs, nothing stops the child for it
        await wait_until(lambda: gone(pid), timeout=STOP_TIMEOUT, interval=0.05)
    finally:
        kill(pid)


def wschat_server(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "wschat.server", "--engine", "llamacpp", "--port", "0"]
    return subprocess.run(
        [*command, "--ping-interval-s", "0", *args],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_wschat_server_refuses_a_model_that_is_not_a_gguf_in_one_line(tmp_path: Path) -> None:
    model = tmp_path / "weights.safetensors"
    model.write_text(json.dumps({"not": "a gguf"}))
    result = wschat_server("--model", str(model))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"wschat-server: {model} is not a GGUF file "
        "(--engine llamacpp takes --model embedded or a .gguf file)"
    ]


def test_wschat_server_exits_1_with_the_reason_when_its_llama_cpp_cannot_start(
    tmp_path: Path,
) -> None:
    model = tmp_path / "cut.gguf"
    model.write_bytes(b"GGUF\x03\x00\x00\x00")  # a GGUF's first bytes, and nothing after
    result = wschat_server("--model", str(model))
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.count("llama.cpp's server (pid") == 1  # started once, not again
    assert "the model failed to load: llama.cpp's server exited before it was ready" in (
        result.stderr
    )
    assert "failed to read header" in result.stderr  # llama.cpp's own words
