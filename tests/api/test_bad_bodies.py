"""Bodies no client library would send, each refused 400 in OpenAI's error shape where the body
is read (web/openai_api/bodies.py, requests.py), never a 500: JSON nested past the parser's
depth, a string holding a lone UTF-16 surrogate (valid JSON, not text) anywhere in the body,
a message whose role is not a string; and a failure of ours on an API route answers 500
``internal`` in that shape with a generic message, its request's slot given back."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.api.test_routes import metric
from tests.fakes.scripted import ScriptedEngine
from tests.support import TIMEOUT, http_base, running_server

if TYPE_CHECKING:
    from wschat.server.engine.openai import OpenAIEngine

DEEP = "the request body nests too deeply"
NOT_TEXT = "a string in the request body holds a lone UTF-16 surrogate: it is not text"


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "any", "messages": [{"role": "user", "content": "Hi"}], **fields}


def encoded(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()  # ensure_ascii: a lone surrogate is written "\ud800"


BODIES = {
    "arrays 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
    "objects 20,000 deep": b'{"a":' * 20_000 + b"1" + b"}" * 20_000,
    "arrays 3,000 deep, a small body": b"[" * 3_000 + b"]" * 3_000,
    "a surrogate in a message": encoded(chat(messages=[{"role": "user", "content": "\ud800"}])),
    "a low surrogate in a system message": encoded(
        chat(messages=[{"role": "system", "content": "a\udc00"}, {"role": "user", "content": "x"}])
    ),
    "a surrogate in a stop string": encoded(chat(stop=["end\ud800"])),
    "a surrogate in the model": encoded(chat(model="\udbff")),
    "a surrogate in an ignored field": encoded(chat(user="\ud800")),
    "a surrogate in a key": encoded(chat(metadata={"\ud800": 1})),
    "a surrogate in a large body": encoded(
        chat(messages=[{"role": "user", "content": "x" * 70_000 + "\ud800"}])
    ),
}
MESSAGES = {
    "arrays 100,000 deep": DEEP,
    "objects 20,000 deep": DEEP,
    "arrays 3,000 deep, a small body": DEEP,
}


async def post(url: str, content: bytes, path: str = "/v1/chat/completions") -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        return await http.post(f"{http_base(url)}{path}", content=content, headers=headers)


def assert_error(
    response: httpx.Response, status: int, message: str, param: str | None, code: str
) -> None:
    assert response.status_code == status, response.text
    kind = "server_error" if status == 500 else "invalid_request_error"
    error = {"message": message, "type": kind, "param": param, "code": code}
    assert response.json() == {"error": error}


@pytest.mark.parametrize("name", BODIES)
async def test_a_body_too_deep_or_not_text_is_400_and_runs_nothing(name: str) -> None:
    engine = ScriptedEngine()
    async with running_server(engine) as url:
        response = await post(url, BODIES[name])
    assert_error(response, 400, MESSAGES.get(name, NOT_TEXT), None, "invalid_params")
    assert engine.requests == []


async def test_a_surrogate_pair_is_text_and_is_served() -> None:
    body = encoded(chat(messages=[{"role": "user", "content": "a smile: \U0001f600"}]))
    assert b"\\ud83d\\ude00" in body
    engine = ScriptedEngine()
    async with running_server(engine) as url:
        response = await post(url, body)
    assert response.status_code == 200, response.text
    (request,) = engine.requests
    assert request.messages[-1].ids == engine.tokenize_text("a smile: \U0001f600")


@pytest.mark.parametrize(
    ("role", "shown"),
    [
        (["user"], "(an array)"),
        ({"user": 1}, "(an object)"),
        (None, "(null)"),
        ("x" * 1000, "'" + "x" * 38 + "…"),
    ],
    ids=["an array", "an object", "null", "a long string"],
)
async def test_a_role_that_is_no_known_name_is_400_and_named_briefly(role: Any, shown: str) -> None:
    body = encoded(chat(messages=[{"role": role, "content": "Hi"}]))
    async with running_server(ScriptedEngine()) as url:
        response = await post(url, body)
    message = f"role {shown} is not supported"
    assert_error(response, 400, message, "messages[0].role", "unsupported")


async def test_a_failure_of_ours_is_500_internal_in_the_error_shape_and_frees_the_slot() -> None:
    engine = ScriptedEngine()
    tokenize = engine.tokenize_text

    def failing(text: str) -> list[int]:
        if "fail" in text:
            raise RuntimeError("a bug of ours")
        return tokenize(text)

    engine.tokenize_text = failing  # type: ignore[method-assign]
    history = [
        {"role": "user", "content": "please fail"},
        {"role": "assistant", "content": "no"},
        {"role": "user", "content": "again"},
    ]
    async with running_server(engine, max_concurrent=1) as url:
        failed = await post(url, encoded(chat(messages=history)))
        streamed = await post(url, encoded(chat(stream=True, messages=history)))
        served = await post(url, encoded(chat()))
        running = await metric(http_base(url), "wschat_generations_running")
    for response in (failed, streamed):
        assert_error(response, 500, "internal error", None, "internal")
    assert served.status_code == 200
    assert running == 0


async def test_a_stop_string_with_a_lone_surrogate_is_400_in_front_of_llama_cpp(
    openai_engine: OpenAIEngine,
) -> None:
    async with running_server(openai_engine) as url:
        refused = await post(url, encoded(chat(stop=["\ud800"], max_tokens=4)))
        served = await post(url, encoded(chat(stop=["\U0001f600"], max_tokens=4)))
    assert_error(refused, 400, NOT_TEXT, None, "invalid_params")
    assert served.status_code == 200, served.text
