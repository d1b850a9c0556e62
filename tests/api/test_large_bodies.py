"""Chat bodies with many messages cost the event loop no more than reading them
(web/openai_api/requests.py, conversation.py): messages and content parts are counted before
any is read (``--max-messages``), every pass over them is linear, and a conversation's texts are
tokenized together in the tokenizer's worker thread and checked against the context before it
is rendered. Meanwhile ``/healthz`` on the same server keeps answering: a probe asks it back to
back, each answer awaited within PROBE_S (a loop held that long holds every client)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.fakes.scripted import ScriptedEngine
from tests.support import TIMEOUT, http_base, running_server, server_process

# Far above what reading the largest of these bodies takes, far below what it took when the
# messages were joined one by one (seconds to a minute on a 2-core machine)
PROBE_S = 8.0


def chat_bytes(messages: list[dict[str, Any]]) -> bytes:
    body = {"model": "any", "messages": messages, "max_tokens": 1}
    return json.dumps(body, separators=(",", ":")).encode()


async def probed(base: str, payload: bytes) -> tuple[httpx.Response, float]:
    """The answer to ``payload`` and the longest ``/healthz`` round trip while it was served
    (each within PROBE_S, or the probe fails)."""
    answered = asyncio.Event()
    longest = 0.0

    async def probe(http: httpx.AsyncClient) -> None:
        nonlocal longest
        while not answered.is_set():
            sent = time.perf_counter()
            async with asyncio.timeout(PROBE_S):
                assert (await http.get(f"{base}/healthz")).status_code == 200
            longest = max(longest, time.perf_counter() - sent)
            await asyncio.sleep(0.005)

    async def post(http: httpx.AsyncClient) -> httpx.Response:
        try:
            headers = {"Content-Type": "application/json"}
            return await http.post(f"{base}/v1/chat/completions", content=payload, headers=headers)
        finally:
            answered.set()

    async with (
        httpx.AsyncClient(timeout=TIMEOUT) as http,
        httpx.AsyncClient(timeout=TIMEOUT) as prober,
        asyncio.TaskGroup() as tasks,  # a probe that fails ends the test with its error
    ):
        tasks.create_task(probe(prober))
        answer = tasks.create_task(post(http))
    response = answer.result()
    return response, longest


async def post_chat(url: str, messages: list[dict[str, Any]], **fields: Any) -> httpx.Response:
    body = {"model": "any", "messages": messages, **fields}
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        return await http.post(f"{http_base(url)}/v1/chat/completions", json=body)


def assert_invalid(
    response: httpx.Response, message: str, param: str | None, code: str = "invalid_params"
) -> None:
    assert response.status_code == 400
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    assert response.json() == {"error": error}


async def test_200000_user_messages_in_a_row_are_refused_while_healthz_answers(
    tmp_path: Path,
) -> None:
    payload = chat_bytes([{"role": "user", "content": f"line {i}"} for i in range(200_000)])
    async with server_process(tmp_path / "server.log") as (_, url):
        response, longest = await probed(http_base(url), payload)
    assert_invalid(response, "at most 2048 messages in a request; it has 200000", "messages")
    assert longest < PROBE_S


async def test_content_parts_are_counted_with_the_bound_on_messages() -> None:
    parts = [{"type": "text", "text": "x"}] * 3
    messages = [{"role": "user", "content": parts}, {"role": "user", "content": parts}]
    async with running_server(ScriptedEngine(), max_messages=5) as url:
        response = await post_chat(url, messages)
    message = "at most 5 content parts in all the messages together; they have 6"
    assert_invalid(response, message, "messages")


async def test_a_conversation_of_short_messages_is_tokenized_off_the_event_loop() -> None:
    engine = ScriptedEngine(context_tokens=1 << 20)
    threads: set[int] = set()  # where each text was tokenized
    tokenize = engine.tokenize_text

    def recorded(text: str) -> list[int]:
        threads.add(threading.get_ident())
        return tokenize(text)

    engine.tokenize_text = recorded  # type: ignore[method-assign]
    roles = ("user", "assistant")
    messages = [{"role": roles[n % 2], "content": f"message {n}"} for n in range(2001)]
    async with running_server(engine) as url:
        response = await post_chat(url, messages, max_tokens=2)
    loop_thread = threading.get_ident()  # the server's too: it runs in this test's loop
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] > 2000 * 8
    # the history in the worker; the last user message (short) on the loop, as a prompt's
    assert len(threads - {loop_thread}) == 1


async def test_a_conversation_over_the_context_is_refused_before_it_is_rendered() -> None:
    roles = ("user", "assistant")
    messages = [{"role": roles[n % 2], "content": "x" * 100} for n in range(41)]
    async with running_server(ScriptedEngine(context_tokens=4000)) as url:
        response = await post_chat(url, messages)
    message = "the conversation's messages are 4000 tokens; the context holds 4000"
    assert_invalid(response, message, None, "context_length_exceeded")


async def test_a_large_body_is_parsed_while_the_event_loop_goes_on() -> None:
    """5,000,000 token ids (10 MiB): json's C parser would hold the loop for all of it."""
    payload = json.dumps(
        {"model": "any", "prompt": [1] * 5_000_000}, separators=(",", ":")
    ).encode()
    gaps: list[float] = []
    answered = asyncio.Event()

    async def ticker() -> None:  # on the server's loop: a gap is a time the loop was held
        last = time.perf_counter()
        while not answered.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    async with running_server(ScriptedEngine()) as url:
        headers = {"Content-Type": "application/json"}
        async with httpx.AsyncClient(timeout=TIMEOUT) as http, asyncio.TaskGroup() as tasks:
            tasks.create_task(ticker())
            started = time.perf_counter()
            try:
                response = await http.post(
                    f"{http_base(url)}/v1/completions", content=payload, headers=headers
                )
            finally:
                answered.set()
            took = time.perf_counter() - started
    message = "the prompt is 5000000 tokens; the context holds 4096"
    assert_invalid(response, message, None, "context_length_exceeded")
    # a ratio, not a speed: parsed on the loop, the longest gap was most of the answer's time
    assert max(gaps) < took / 4, (max(gaps), took)
