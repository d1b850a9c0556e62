"""Every refusal of the API in OpenAI's error shape (web/openai_api/errors.py, requests.py):
``{"error": {"message", "type", "param", "code"}}``, with the status its code calls for: the
peer's fault 400, over a size limit 413, capacity 429; the code is the WebSocket's for the same
refusal (``context_length_exceeded`` for the context, as OpenAI spells it)."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import openai
import pytest

from tests.api.support import assistant, async_client, user
from tests.fakes.scripted import ScriptedEngine
from tests.images import samples
from tests.support import TIMEOUT, http_base, loading_server, running_server

CHAT = "/v1/chat/completions"
JSON = {"Content-Type": "application/json"}
LIMITS: dict[str, Any] = {
    "max_new_tokens": 64,
    "max_image_bytes": 2000,
    "max_frame_bytes": 100_000,
    "max_prompt_bytes": 1000,
    "max_messages": 4,
}


def image_part(data: bytes) -> dict[str, Any]:
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "any", "messages": [user("Hi")], **fields}


CHAT_REFUSALS = [
    (chat(top_logprobs=3), 400, "invalid_params", "top_logprobs"),
    (chat(logprobs=True, top_logprobs=21), 400, "invalid_params", "top_logprobs"),
    (chat(logprobs="yes"), 400, "invalid_params", "logprobs"),
    (chat(functions=[{"name": "f"}]), 400, "unsupported", "functions"),
    (chat(tools=[{"type": "retrieval"}]), 400, "unsupported", "tools[0].type"),
    (
        chat(tools=[{"type": "function", "function": {"name": "f g"}}]),
        400,
        "invalid_params",
        "tools",
    ),
    (chat(tool_choice="sometimes"), 400, "invalid_params", "tool_choice"),
    (chat(frequency_penalty=0.5), 400, "unsupported", "frequency_penalty"),
    (chat(presence_penalty=1), 400, "unsupported", "presence_penalty"),
    (chat(logit_bias={"1": 5}), 400, "unsupported", "logit_bias"),
    (chat(response_format={"type": "xml"}), 400, "invalid_params", "response_format"),
    (
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
        400,
        "invalid_params",
        "response_format",
    ),
    (chat(temperature=3), 400, "invalid_params", "temperature"),
    (chat(min_p=1.5), 400, "invalid_params", "min_p"),
    (chat(stream_options={"include_usage": True}), 400, "invalid_params", "stream_options"),
    (chat(stream=False, stream_options={}), 400, "invalid_params", "stream_options"),
    (chat(max_completion_tokens=0), 400, "invalid_params", "max_completion_tokens"),
    (chat(stop=[""]), 400, "invalid_params", "stop"),
    (chat(stream="yes"), 400, "invalid_params", "stream"),
    ({"messages": [user("Hi")]}, 400, "invalid_params", "model"),
    (chat(messages=[]), 400, "invalid_params", "messages"),
    (chat(messages=[user("Hi"), assistant("Yes")]), 400, "invalid_params", "messages"),
    (chat(messages=[assistant("Yes"), user("Hi")]), 400, "invalid_params", "messages"),
    (chat(messages=[{"role": "function", "content": "x"}]), 400, "unsupported", "messages[0].role"),
    (
        chat(messages=[user("Hi"), {"role": "tool", "content": "x"}]),
        400,
        "invalid_params",
        "messages[1].tool_call_id",
    ),
    (
        chat(messages=[user(""), {"role": "system", "content": "late"}, user("x")]),
        400,
        "invalid_params",
        "messages",
    ),
    (chat(messages=[user("x" * 1001)]), 413, "too_large", None),
    (chat(messages=[user("x")] * 5), 400, "invalid_params", "messages"),
    (
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": "x"}] * 5}]),
        400,
        "invalid_params",
        "messages",
    ),
    (chat(messages=[user("w" * 300)]), 400, "context_length_exceeded", None),
    (
        chat(messages=[{"role": "user", "content": [image_part(samples.png())]}]),
        400,
        "unsupported",
        None,
    ),
    (
        chat(messages=[{"role": "user", "content": [{"type": "input_audio"}]}]),
        400,
        "unsupported",
        "messages[0].content[0]",
    ),
]


COMPLETION_REFUSALS = [
    ({"model": "m", "prompt": ["a", "b"]}, 400, "unsupported", "prompt"),
    ({"model": "m", "prompt": "a", "echo": True}, 400, "unsupported", "echo"),
    ({"model": "m", "prompt": "a", "logprobs": 21}, 400, "invalid_params", "logprobs"),
    ({"model": "m", "prompt": "a", "logprobs": True}, 400, "invalid_params", "logprobs"),
    ({"model": "m", "prompt": "a", "best_of": 3}, 400, "unsupported", "best_of"),
    ({"model": "m", "prompt": "a", "suffix": "z"}, 400, "unsupported", "suffix"),
    ({"model": "m", "prompt": ""}, 400, "invalid_params", "prompt"),
    (
        {"model": "m", "prompt": "a", "stream_options": {"include_usage": True}},
        400,
        "invalid_params",
        "stream_options",
    ),
    ({"model": "m", "prompt": [1, -2]}, 400, "invalid_params", "prompt"),
    ({"model": "m", "prompt": [1, 1 << 40]}, 400, "invalid_params", "prompt"),
    ({"model": "m", "prompt": list(range(300))}, 400, "context_length_exceeded", None),
]


REFUSALS = [
    *(("/v1/chat/completions", *refusal) for refusal in CHAT_REFUSALS),
    *(("/v1/completions", *refusal) for refusal in COMPLETION_REFUSALS),
]


@pytest.mark.parametrize(("path", "body", "status", "code", "param"), REFUSALS)
async def test_a_refused_request_gets_the_error_shape_and_runs_nothing(
    path: str, body: dict[str, Any], status: int, code: str, param: str | None
) -> None:
    engine = ScriptedEngine(context_tokens=256)
    async with running_server(engine, **LIMITS) as url:
        refused = await post(url, path, json=body)
    assert_refused(refused, status, code, param)
    assert engine.requests == []


async def test_a_body_over_the_frame_limit_is_413_and_one_not_json_is_400() -> None:
    async with running_server(ScriptedEngine(), **LIMITS) as url:
        large = await post(url, CHAT, content=b"{" + b" " * 100_000 + b"}", headers=JSON)
        garbled = await post(url, CHAT, content=b"{not json", headers=JSON)
    assert_refused(large, 413, "too_large", None)
    assert_refused(garbled, 400, "invalid_params", None)


async def test_images_over_the_byte_limit_are_413_and_undecodable_ones_400() -> None:
    engine = ScriptedEngine(images=True)
    big = samples.encoded(samples.noise(64, 64), "PNG")
    assert len(big) > LIMITS["max_image_bytes"]
    async with running_server(engine, **LIMITS) as url:
        over = await post(
            url,
            "/v1/chat/completions",
            json=chat(messages=[{"role": "user", "content": [image_part(big)]}]),
        )
        earlier = await post(
            url,
            "/v1/chat/completions",
            json=chat(
                messages=[
                    {"role": "user", "content": [image_part(big)]},
                    assistant("ok"),
                    user("and?"),
                ]
            ),
        )
        junk = await post(
            url,
            "/v1/chat/completions",
            json=chat(messages=[{"role": "user", "content": [image_part(b"not an image")]}]),
        )
    assert_refused(over, 413, "too_large", None)
    assert_refused(earlier, 413, "too_large", None)
    assert_refused(junk, 400, "bad_image", None)


async def post(url: str, path: str, **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        return await http.post(f"{http_base(url)}{path}", **kwargs)


def assert_refused(response: httpx.Response, status: int, code: str, param: str | None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"]) == (code, param), error
    assert error["type"] == ("invalid_request_error" if status < 429 else "rate_limit_error")
    assert isinstance(error["message"], str) and error["message"]


async def test_a_request_while_the_model_loads_is_503_with_retry_after() -> None:
    async with loading_server(ScriptedEngine()) as (url, load):
        loading = await post(url, "/v1/chat/completions", json=chat())
        load.release()
    assert loading.status_code == 503 and loading.headers["retry-after"] == "1"
    assert loading.json() == {
        "error": {
            "message": "the model is loading",
            "type": "server_error",
            "param": None,
            "code": "overloaded",
        }
    }


async def test_a_page_of_another_origin_is_403_in_the_api_shape() -> None:
    async with running_server(ScriptedEngine()) as url:
        foreign = await post(
            url, "/v1/chat/completions", json=chat(), headers={"Origin": "https://evil.example"}
        )
    assert foreign.status_code == 403
    assert foreign.json()["error"] == {
        "message": "this Origin may not connect",
        "type": "permission_error",
        "param": None,
        "code": "forbidden",
    }


@pytest.mark.parametrize(
    "content_type",
    ["application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x", None],
)
async def test_a_json_body_sent_as_another_type_is_415_and_runs_nothing(
    content_type: str | None,
) -> None:
    engine = ScriptedEngine()
    headers = {"Content-Type": content_type} if content_type else {}
    async with running_server(engine) as url:
        refused = await post(url, CHAT, content=json.dumps(chat()).encode(), headers=headers)
        for path in (CHAT, "/v1/completions"):
            declared = await post(url, path, content=b"{}", headers=headers)
            assert declared.status_code == 415
    assert refused.status_code == 415
    assert refused.json() == {
        "error": {
            "message": "the request body must be JSON, sent with Content-Type: application/json",
            "type": "invalid_request_error",
            "param": None,
            "code": "unsupported_media_type",
        }
    }
    assert engine.requests == []


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "Application/JSON"])
async def test_json_with_a_charset_or_in_capitals_is_json(content_type: str) -> None:
    async with running_server(ScriptedEngine()) as url:
        served = await post(
            url, CHAT, content=json.dumps(chat()).encode(), headers={"Content-Type": content_type}
        )
    assert served.status_code == 200, served.text


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/nothing"), ("POST", "/v1/embeddings"), ("GET", "/v1/chat/completions")],
)
async def test_an_unknown_path_under_v1_is_404_in_the_api_shape(method: str, path: str) -> None:
    async with running_server(ScriptedEngine()) as url, httpx.AsyncClient(timeout=TIMEOUT) as http:
        response = await http.request(method, f"{http_base(url)}{path}")
    assert response.status_code == 404
    assert response.json() == {
        "error": {
            "message": f"Invalid URL ({method} {path})",
            "type": "invalid_request_error",
            "param": None,
            "code": "unknown_url",
        }
    }


async def test_the_sdk_gets_not_found_for_an_endpoint_the_server_lacks() -> None:
    async with running_server(ScriptedEngine()) as url, async_client(url) as client:
        with pytest.raises(openai.NotFoundError) as missing:
            await client.embeddings.create(model="any", input="Hi")
    assert missing.value.body == {
        "message": "Invalid URL (POST /v1/embeddings)",
        "type": "invalid_request_error",
        "param": None,
        "code": "unknown_url",
    }
