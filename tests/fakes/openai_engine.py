"""``MisbehavingEngine``: an OpenAI-compatible engine of the tests' own, a small HTTP/1.1 server on
an ephemeral loopback port that speaks as llama.cpp's server (``/completion``), vLLM or SGLang
(``/v1/completions``) does, and answers each completion (and each chat completion) with whatever
its test scripts: tokens past ``max_tokens``, numbers out of any range, a line that never ends,
an error with a huge body. Other routes (``/tokenize``, ``/props``, ``/model_info``) answer what
the test gives them, else 404.

It runs on the test's event loop, beside the real uvicorn the test serves wschat with. Every
reply is sent with ``Connection: close`` and ends where the connection does; the engine counts
what it wrote of each reply and whether the reader closed the connection before the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from wschat.server.engine.openai.dialect import LLAMA_CPP, SGLANG, VLLM

from tests.support import TIMEOUT

MODEL = "misbehaving"
# what one write hands the socket at most: big replies leave in pieces, as an engine's do
WRITE_BYTES = 64 * 1024
# the most chunks an endless reply sends: bounded, yet far past any max_tokens of a test
ENDLESS_CHUNKS = 10_000_000
CHAT_PATH = "/v1/chat/completions"
# each engine as the fake speaks it: the owner /v1/models lists, where a text prompt goes
SPELLINGS = {
    LLAMA_CPP: ("llamacpp", "/completion"),
    VLLM: ("vllm", "/v1/completions"),
    SGLANG: ("sglang", "/v1/completions"),
}


@dataclass
class Answer:
    """A reply: its status, its headers, and its body as the pieces it is written in."""

    body: Iterable[bytes]
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "text/event-stream"})


@dataclass
class Served:
    """One completion request and what became of its reply."""

    path: str
    body: dict[str, Any]
    sent: int = 0  # bytes of the reply's body written
    closed_early: bool = False  # the reader closed the connection before the reply's end
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    async def end(self) -> Served:
        async with asyncio.timeout(TIMEOUT):
            await self.ended.wait()
        return self


Script = Callable[[str, dict[str, Any]], Answer]
# a route's JSON answer to a request's JSON body
Route = Callable[[dict[str, Any]], Any]


class MisbehavingEngine:
    def __init__(
        self,
        dialect: str,
        script: Script,
        *,
        context_tokens: int = 8192,
        routes: dict[str, Route] | None = None,
        owner: str | None = None,
    ) -> None:
        self.dialect = dialect
        self.owner, self.text_path = SPELLINGS[dialect]
        self.owner = owner or self.owner  # another owner: an engine behind a proxy that says so
        self.script = script
        self.context_tokens = context_tokens
        self.routes = routes or {}
        self.served: list[Served] = []
        self._server: asyncio.Server | None = None

    @property
    def api_url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            async with asyncio.timeout(TIMEOUT):
                await self._server.wait_closed()

    def models(self) -> dict[str, Any]:
        entry = {"id": MODEL, "owned_by": self.owner, "max_model_len": self.context_tokens}
        if self.dialect == LLAMA_CPP:
            entry["meta"] = {"n_ctx": self.context_tokens}
        return {"object": "list", "data": [entry]}

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(TIMEOUT):
                method, path, body = await _request(reader)
            if path in (self.text_path, CHAT_PATH) and method == "POST":
                served = Served(path, body)
                self.served.append(served)
                try:
                    await self._answer(writer, self.script(path, body), served)
                finally:
                    served.ended.set()
            elif path == "/v1/models":
                await _write_whole(writer, 200, json.dumps(self.models()).encode())
            elif path == "/health":
                await _write_whole(writer, 200, b'{"status": "ok"}')
            elif path in self.routes:
                await _write_whole(writer, 200, json.dumps(self.routes[path](body)).encode())
            else:  # /tokenize, /props: an engine that has none (the start goes on without)
                await _write_whole(writer, 404, b'{"error": {"message": "not found"}}')
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(TIMEOUT):
                    await writer.wait_closed()

    async def _answer(self, writer: asyncio.StreamWriter, answer: Answer, served: Served) -> None:
        head = [f"HTTP/1.1 {answer.status} X", "Connection: close"]
        head += [f"{name}: {value}" for name, value in answer.headers.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        try:
            for piece in _pieces(answer.body):
                writer.write(piece)
                async with asyncio.timeout(TIMEOUT):
                    await writer.drain()
                served.sent += len(piece)
        except (ConnectionError, TimeoutError):
            served.closed_early = True


async def _request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, Any]]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    method, path, _ = head[0].split(" ", 2)
    length = 0
    for line in head[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    data = await reader.readexactly(length) if length else b""
    return method, path, json.loads(data) if data else {}


async def _write_whole(writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
    head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    writer.write(head.encode() + body)
    await writer.drain()


def _pieces(body: Iterable[bytes]) -> Iterator[bytes]:
    """The body's bytes in writes of about ``WRITE_BYTES``: many small chunks go together."""
    batch = bytearray()
    for data in body:
        batch += data
        while len(batch) >= WRITE_BYTES:
            yield bytes(batch[:WRITE_BYTES])
            del batch[:WRITE_BYTES]
    if batch:
        yield bytes(batch)


@contextlib.asynccontextmanager
async def misbehaving_engine(
    dialect: str, script: Script, **options: Any
) -> AsyncIterator[MisbehavingEngine]:
    engine = MisbehavingEngine(dialect, script, **options)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


# -- what an engine streams, in each dialect's words -------------------------------------------


def sse(chunk: Any) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def token(dialect: str, text: Any, ids: Any) -> bytes:
    """One chunk of a text reply: ``text`` and its token ``ids``."""
    if dialect == LLAMA_CPP:
        return sse({"index": 0, "content": text, "tokens": ids, "stop": False})
    return sse({"choices": [{"index": 0, "text": text, "token_ids": ids, "finish_reason": None}]})


def last(dialect: str, cached: Any = 0, finish: str = "stop") -> bytes:
    """The end of a text reply: why it stopped, and the prompt tokens found in the cache."""
    if dialect == LLAMA_CPP:
        stop_type = "limit" if finish == "length" else "eos"
        timings = {"cache_n": cached}
        return sse(
            {"content": "", "tokens": [], "stop": True, "stop_type": stop_type, "timings": timings}
        )
    choice = {"index": 0, "text": "", "token_ids": [], "finish_reason": finish}
    details = {"cached_tokens": cached}
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "prompt_tokens_details": details}
    return sse({"choices": [choice]}) + sse({"choices": [], "usage": usage}) + b"data: [DONE]\n\n"


def chat_text(text: Any, finish: str | None = None) -> bytes:
    """One chunk of a chat reply that gives its text alone, no ids (SGLang's chat API)."""
    choice = {"index": 0, "delta": {"role": "assistant", "content": text}, "logprobs": None}
    return sse({"choices": [{**choice, "finish_reason": finish, "matched_stop": None}]})


def reply(dialect: str, pieces: list[tuple[str, list[Any]]], cached: Any = 0) -> Answer:
    """A short reply that ends as an engine's does."""
    return Answer([*(token(dialect, t, ids) for t, ids in pieces), last(dialect, cached)])


def endless(dialect: str, text: str, token_id: int) -> Answer:
    """Tokens for ever (well, ``ENDLESS_CHUNKS``), whatever ``max_tokens`` asked."""
    chunk = token(dialect, text, [token_id])
    return Answer(chunk for _ in range(ENDLESS_CHUNKS))


def megabytes(size: int, piece: bytes = b"x") -> Iterator[bytes]:
    """``size`` bytes of ``piece``, in writes of ``WRITE_BYTES``."""
    block = piece * (WRITE_BYTES // len(piece))
    for _ in range(size // len(block)):
        yield block
