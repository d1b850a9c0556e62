"""llama.cpp's server (``xllamacpp``) on the embedded GGUF, as a process the tests start and stop
by its pid: 127.0.0.1, one thread, ``swa_full``, two slots of 2048 tokens."""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from wschat.server.engine.embedded import default_cache_dir
from wschat.server.engine.openai import OpenAIEngineConfig

from tests.support import ROOT, TIMEOUT

SLOTS = 2
SLOT_CONTEXT = 2048
# loading a 250 MB GGUF on a busy 2-core machine
START_TIMEOUT = 120.0


class LlamaServer:
    def __init__(self, port: int, log: Path) -> None:
        self.port = port
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.url}/v1"

    def start(self) -> None:
        command = [
            sys.executable,
            "-m",
            "wschat.server.runtime.llamacpp",
            "--port",
            str(self.port),
            "--threads",
            "1",
            "--parallel",
            str(SLOTS),
            "--ctx",
            str(SLOTS * SLOT_CONTEXT),
            "--swa-full",
            "--slot-dir",
            str(self.log.parent),
        ]
        with self.log.open("ab") as sink:
            self.process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=sink, cwd=ROOT, env=dict(os.environ)
            )
        assert self.process.stdout is not None
        line = _read_line(self.process.stdout, START_TIMEOUT)
        assert line.startswith("listening on "), (line, self.log.read_text()[-2000:])

    def stop(self) -> None:
        """SIGKILL by pid: also what "the engine died mid-reply" means."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(TIMEOUT)
            if self.process.stdout is not None:
                self.process.stdout.close()
        self.process = None

    def slots(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/slots", timeout=5)
        response.raise_for_status()
        slots: list[dict[str, Any]] = response.json()
        return slots

    def busy_slots(self) -> int:
        return sum(1 for slot in self.slots() if slot.get("is_processing"))

    def erase_slots(self) -> None:
        """Forget every slot's cached prompt (``POST /slots/{id}?action=erase``), so the next
        prompt is prefilled whole."""
        for slot in self.slots():
            response = httpx.post(
                f"{self.url}/slots/{slot['id']}", params={"action": "erase"}, timeout=TIMEOUT
            )
            response.raise_for_status()

    def predicted_tokens(self) -> int:
        """Tokens the server has generated since it started, a reply given up included
        (``/metrics``' ``llamacpp:tokens_predicted_total``)."""
        response = httpx.get(f"{self.url}/metrics", timeout=5)
        response.raise_for_status()
        for line in response.text.splitlines():
            if line.startswith("llamacpp:tokens_predicted_total "):
                return int(float(line.split()[1]))
        raise AssertionError("no llamacpp:tokens_predicted_total in /metrics")

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        response = httpx.post(f"{self.api_url}/completions", json=body, timeout=TIMEOUT)
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer

    def config(self, **overrides: Any) -> OpenAIEngineConfig:
        values: dict[str, Any] = {
            "url": self.api_url,
            "tokenizer": "embedded",
            "cache_dir": default_cache_dir(),
            **overrides,
        }
        return OpenAIEngineConfig(**values)


def _read_line(stream: Any, timeout: float) -> str:
    """One line of a child's stdout, or what there was when ``timeout`` ran out."""
    selector = selectors.DefaultSelector()
    selector.register(stream, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not selector.select(left):
            break
        chunk = os.read(stream.fileno(), 1)
        if not chunk:
            break
        data += chunk
    selector.close()
    return data.decode(errors="replace").strip()


@contextlib.contextmanager
def llama_server(port: int, log: Path) -> Iterator[LlamaServer]:
    server = LlamaServer(port, log)
    server.start()
    try:
        yield server
    finally:
        server.stop()
