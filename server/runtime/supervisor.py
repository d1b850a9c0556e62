"""``--engine llamacpp``: llama.cpp's server as a child process of wschat, with the openai engine
in front of it (``launch``).

The child is ``python -m wschat.server.runtime.llamacpp`` (the ``xllamacpp`` wheel) on the
embedded GGUF or a ``.gguf`` file, on a loopback port it picks, with an API key of this start's
own (a loopback port is open to every local user). ``LlamaCppServer`` starts it, waits until it
listens and answers ``/health``, restarts it when it dies and stops it with us.

The rule for failures: a child that never became healthy fails the start with llama.cpp's own
reason (a port it cannot bind, a model it cannot load: ``LlamaCppError``), and the server exits
1 as it does for a model that fails to load. A child that was healthy and died is restarted
after ``FIRST_RETRY_S``, the delay doubling up to ``MAX_RETRY_S`` while restarts keep failing
(a restart fails when its child never becomes healthy). A child that became healthy has served:
its death starts again from ``FIRST_RETRY_S``, however soon it comes (a delay carried over from
earlier deaths would keep the service away longer than a restart takes; loading the model
spaces restarts out). Meanwhile prompts get ``overloaded`` and ``/readyz`` says the engine is
unreachable, as with any remote engine; a reply that was streaming ends in an error.

No child outlives us: closing the engine stops it (SIGTERM, SIGKILL after ``STOP_GRACE_S``), and
it stops by itself once its standard input ends, a pipe whose other end only this process holds,
which the kernel closes however this process dies. Its output goes to our log line by line,
prefixed ``llama.cpp:``, at its own level but for the warnings known to be harmless
(``llamacpp_output.py``); its info lines (five a request) only where our log takes debug lines:
each line wakes a thread here, which takes the interpreter from the event loop while replies
start.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from ..engine.cores import threads_now, usable_cores
from ..engine.embedded import EMBEDDED
from ..engine.openai.client import EngineHttp
from ..engine.openai.engine import OpenAIEngine
from ..engine.openai.startup import OpenAIEngineConfig, connect
from ..engine.openai.tokenizer import gguf_path
from .llamacpp import API_KEY_VARIABLE, model_alias
from .llamacpp_output import relayed

log = logging.getLogger("wschat.engine.llamacpp")

NAME = "llamacpp"
START_TIMEOUT_S = 300.0  # loading a large GGUF from a slow disk
STOP_GRACE_S = 5.0
FIRST_RETRY_S = 0.5
MAX_RETRY_S = 30.0
_POLL_S = 0.05
_REASON_LINES = 3  # of llama.cpp's error lines, in a failure's reason
_LISTENING = "listening on "
# Where it listens: llama.cpp's own line (it comes first) or the launcher's; the launcher's
# prints only once its call into llama.cpp returns, which under load has been seen not to
# happen after llama.cpp had logged that it listened. /health then says whether it serves.
_LISTENING_AT = re.compile(r"(?:^|\s)listening on (http://\S+)")


class LlamaCppError(RuntimeError):
    """llama.cpp's server cannot be started; the message says why, in one line."""


@dataclass(frozen=True, slots=True)
class LlamaCppConfig:
    model: str  # "embedded" or a .gguf file
    cache_dir: Path
    threads: int | None  # None: auto, chosen as each child starts (engine/cores.py)
    slots: int  # requests decoding at once (llama.cpp's --parallel)
    slot_context: int  # KV tokens of each slot: one conversation's context
    # MiB of RAM where llama.cpp keeps the KV of a conversation whose slot another one took
    idle_kv_mib: int = 1024
    port: int = 0  # 0: a free one, picked by the server
    start_timeout_s: float = START_TIMEOUT_S


def gguf_file(model: str, cache_dir: Path) -> Path:
    """The GGUF ``--model`` names: the embedded one, or ``checked_gguf(model)``."""
    return gguf_path(cache_dir) if model == EMBEDDED else checked_gguf(model)


def checked_gguf(model: str) -> Path:
    """A file that begins as a GGUF does; ``LlamaCppError`` otherwise."""
    path = Path(model).expanduser()
    usage = "--engine llamacpp takes --model embedded or a .gguf file"
    if not path.is_file():
        raise LlamaCppError(f"no file at {path} ({usage})")
    with path.open("rb") as handle:
        if handle.read(4) != b"GGUF":
            raise LlamaCppError(f"{path} is not a GGUF file ({usage})")
    return path


def retry_delay(failures: int) -> float:
    """Seconds before a restart after ``failures`` restarts in a row that failed."""
    return min(MAX_RETRY_S, FIRST_RETRY_S * float(1 << min(failures, 32)))


def launch(config: LlamaCppConfig, *, tokenizer: str | None, prompt_format: str) -> OpenAIEngine:
    """Start llama.cpp's server and connect the openai engine to it; closing the engine stops
    the server. ``tokenizer``: None for the model's own (built from its GGUF). In the loading
    thread (blocking calls)."""
    server = LlamaCppServer(config)
    url = server.start()
    try:
        http = EngineHttp(url, server.api_key)
        server.supervise(on_url=http.move_to)
        own = EMBEDDED if config.model == EMBEDDED else str(server.model)
        gateway = OpenAIEngineConfig(
            url=url,
            tokenizer=tokenizer or own,
            cache_dir=config.cache_dir,
            prompt_format=prompt_format,
            context_tokens=config.slot_context,
        )
        engine = connect(gateway, http=http, name=NAME)
    except BaseException:
        server.stop()
        raise
    engine.child = server
    return engine


class _Child:
    """One started process: what its output said (the URL it listens on, its error lines), read
    by a thread per pipe that forwards every line to our log (``llamacpp_output.py``).

    Its stdout and stderr are two pipes: llama.cpp logs to stderr, and the launcher says where it
    listens on stdout. In one pipe the two writers' bytes met mid-line (the launcher's line and
    its end of line are two writes where Python's output is unbuffered), which glued a llama.cpp
    line to the URL ("...:8080I srv  init: ...")."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.url: str | None = None
        self.listening = threading.Event()  # set by a reader once the URL is known
        self.errors: list[str] = []  # llama.cpp's first error lines: why it failed
        self.last_other = ""  # the last line not in llama.cpp's format (Python's own error)
        assert process.stdout is not None and process.stderr is not None
        self._readers = [
            threading.Thread(
                target=self._read, args=(stream,), name="wschat-llamacpp-log", daemon=True
            )
            for stream in (process.stdout, process.stderr)
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            line = raw.decode(errors="replace").rstrip()
            if self.url is None and (found := _LISTENING_AT.search(line)):
                self.url = found[1]
                self.listening.set()
            if line.startswith(_LISTENING):
                continue
            said = relayed(line)
            if said.llama_cpp and said.level >= logging.ERROR:
                if len(self.errors) < _REASON_LINES:
                    self.errors.append(said.text)
            elif not said.llama_cpp and said.text:
                self.last_other = said.text
            log.log(said.level, "llama.cpp: %s", said.text)

    def finish_reading(self) -> None:
        """Until the readers have read the output of a child that exited (its pipes' ends)."""
        for reader in self._readers:
            reader.join(STOP_GRACE_S)

    def status(self) -> str:
        code = self.process.returncode
        if code is not None and code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit status {code}"

    def reason(self) -> str:
        said = "; ".join(self.errors) or self.last_other or "no error message"
        return f"llama.cpp's server exited before it was ready ({self.status()}): {said}"

    def stop(self, grace_s: float) -> None:
        """SIGTERM, SIGKILL after ``grace_s``; reaped, its output read, its pipes closed."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                if grace_s > 0:
                    log.warning("llama.cpp's server (pid %d) ignored SIGTERM", self.process.pid)
                self.process.kill()
                self.process.wait()
        self.finish_reading()
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


class LlamaCppServer:
    """llama.cpp's server as a child: ``start`` (until healthy), ``supervise`` (restarts with
    backoff), ``stop``."""

    def __init__(self, config: LlamaCppConfig) -> None:
        self.config = config
        self.model = gguf_file(config.model, config.cache_dir)
        self.api_key = secrets.token_urlsafe(24)
        # the threads of the child that runs (or starts next): auto's are chosen as it starts
        self.threads = config.threads or usable_cores()
        self._lock = threading.Lock()  # guards _child: the watcher replaces it, stop takes it
        self._child: _Child | None = None
        self._stopping = threading.Event()  # set by stop: no more starts or restarts
        self._watcher: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        child = self._child
        return child.process.pid if child is not None else None

    @property
    def url(self) -> str | None:
        child = self._child
        return child.url if child is not None else None

    def start(self) -> str:
        """The first child, once it answers ``/health``: its URL. ``LlamaCppError`` if it
        exits or times out first."""
        child = self._launch()
        with self._lock:
            self._child = child
        return child.url or ""

    def supervise(self, on_url: Callable[[str], None]) -> None:
        """Restart the child whenever it dies, calling ``on_url`` with each new child's URL."""
        self._watcher = threading.Thread(
            target=self._watch, args=(on_url,), name="wschat-llamacpp-watch", daemon=True
        )
        self._watcher.start()

    def stop(self) -> None:
        """Stop the child (SIGTERM, then SIGKILL after the grace) and every restart."""
        self._stopping.set()
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            child.stop(STOP_GRACE_S)
            log.info("llama.cpp's server (pid %d) stopped: %s", child.process.pid, child.status())
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(STOP_GRACE_S * 2)

    # -- the child's life -------------------------------------------------------------------

    def _command(self) -> list[str]:
        config = self.config
        return [
            sys.executable, "-m", "wschat.server.runtime.llamacpp",
            "--model", str(self.model),
            "--host", "127.0.0.1",
            "--port", str(config.port),
            "--threads", str(self.threads),
            "--parallel", str(config.slots),
            "--ctx", str(config.slots * config.slot_context),
            "--swa-full",
            "--cache-ram-mib", str(config.idle_kv_mib),
            "--alias", model_alias(config.model),
            "--cache-dir", str(config.cache_dir),
            "--until-stdin-closes",
            "--verbosity", "3" if log.isEnabledFor(logging.DEBUG) else "2",
        ]  # fmt: skip

    def _launch(self) -> _Child:
        """A new child, listening and healthy; ``LlamaCppError`` (the child reaped) if not."""
        env = {**os.environ, API_KEY_VARIABLE: self.api_key}
        self.threads = self.config.threads or threads_now()[0]
        process = subprocess.Popen(
            self._command(),
            stdin=subprocess.PIPE,  # never written: its end is how the child learns we are gone
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,  # apart from stdout (_Child)
            env=env,
        )
        child = _Child(process)
        log.info(
            "llama.cpp's server (pid %d) starting: %s, %d threads, %d slots of %d tokens",
            process.pid,
            self.model,
            self.threads,
            self.config.slots,
            self.config.slot_context,
        )
        try:
            self._wait_healthy(child, time.monotonic() + self.config.start_timeout_s)
        except BaseException:
            child.stop(0)
            raise
        log.info("llama.cpp's server (pid %d) ready at %s", process.pid, child.url)
        return child

    def _wait_healthy(self, child: _Child, deadline: float) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"}
        # what a start that times out is told: how far the child got
        last = "it never said where it listens"
        while True:
            if self._stopping.is_set():
                raise LlamaCppError("the server is stopping")
            if child.process.poll() is not None:
                child.finish_reading()
                raise LlamaCppError(child.reason())
            if time.monotonic() > deadline:
                raise LlamaCppError(
                    f"llama.cpp's server was not ready within "
                    f"{self.config.start_timeout_s:.0f} s ({last})"
                )
            if child.url is None:
                child.listening.wait(_POLL_S)
            elif (answer := _health(f"{child.url}/health", headers)) is None:
                return
            else:
                last = f"listening on {child.url}; /health {answer}"
                time.sleep(_POLL_S)

    def _watch(self, on_url: Callable[[str], None]) -> None:
        while (child := self._child) is not None:
            child.process.wait()
            if self._stopping.is_set():
                return
            log.error(
                "llama.cpp's server (pid %d) died (%s); restarting in %.1f s",
                child.process.pid,
                child.status(),
                FIRST_RETRY_S,
            )
            child.stop(STOP_GRACE_S)
            replacement = self._restart()
            if replacement is None:
                return
            with self._lock:
                if self._stopping.is_set():
                    replacement.stop(STOP_GRACE_S)
                    return
                self._child = replacement
            on_url(replacement.url or "")

    def _restart(self) -> _Child | None:
        """A healthy new child, the delay doubling with each start that fails; None once
        stopping."""
        failures = 0
        while not self._stopping.wait(retry_delay(failures)):
            try:
                return self._launch()
            except LlamaCppError as error:
                if self._stopping.is_set():
                    return None
                failures += 1
                log.error(
                    "llama.cpp's server did not restart (%s); again in %.1f s",
                    error,
                    retry_delay(failures),
                )
        return None


def _health(url: str, headers: dict[str, str]) -> str | None:
    """None when the server is healthy, else what it answered."""
    try:
        status = httpx.get(url, headers=headers, timeout=2.0).status_code
    except httpx.HTTPError as error:
        return f"did not answer ({type(error).__name__})"
    return None if status == 200 else f"answered {status}"
