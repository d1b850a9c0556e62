"""``response_format`` and logprobs on ``/v1/chat/completions`` and ``/v1/completions`` through the
official ``openai`` SDK against a real uvicorn: a strict ``json_schema`` reply parses into a
pydantic model on the embedded model (the SDK's ``parse``), a schema the grammar cannot enforce
or one past the caps is a 400 with the reason and the server goes on, and logprobs come in
OpenAI's shapes, streamed and whole, one entry per generated token."""

from __future__ import annotations

import asyncio
import json
import re
from typing import TYPE_CHECKING, Any, Literal

import httpx
import pytest
from pydantic import BaseModel, Field
from wschat.protocol.tools import MAX_SCHEMA_DEPTH, MAX_SCHEMA_VALUES

from tests.api.support import async_client, user
from tests.support import TIMEOUT, http_base, running_server

if TYPE_CHECKING:
    from wschat.server.engine.local.hf import HFEngine

UNIQUE = {
    "type": "object",
    "properties": {"v": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}},
    "required": ["v"],
    "additionalProperties": False,
}
BOUNDED = {
    "type": "object",
    "properties": {"colour": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
    "required": ["colour", "ok"],
    "additionalProperties": False,
}


def schema_format(schema: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": strict}}


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


async def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        return await client.post(f"{http_base(url)}/v1/{path}", json=body)


async def test_a_schema_the_grammar_cannot_enforce_is_a_400_and_the_server_goes_on(
    tiny_engine: HFEngine,
) -> None:
    async with running_server(tiny_engine) as url:
        body = {"model": "m", "messages": [user("Hi")], "max_tokens": 4}
        refused = await post(
            url, "chat/completions", body | {"response_format": schema_format(UNIQUE)}
        )
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["code"] == "invalid_params"
        assert error["message"].startswith("response_format: the schema cannot be enforced: ")
        assert "uniqueItems" in error["message"]
        # without strict, the keyword is left out and the rest enforced
        lenient = await post(
            url, "chat/completions", body | {"response_format": schema_format(UNIQUE, False)}
        )
        assert lenient.status_code == 200
        plain = await post(url, "chat/completions", body)
        assert plain.status_code == 200


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (nested(MAX_SCHEMA_DEPTH), f"is nested more than {MAX_SCHEMA_DEPTH} deep"),
        (
            {"type": "object", "properties": {f"p{i}": {} for i in range(MAX_SCHEMA_VALUES)}},
            f"holds more than {MAX_SCHEMA_VALUES} values",
        ),
        ({"type": "string", "pattern": "a" * 70_000}, "holds more than 65536 characters"),
    ],
)
async def test_a_schema_past_a_cap_is_a_400_that_names_the_cap(
    tiny_engine: HFEngine, schema: dict[str, Any], message: str
) -> None:
    async with running_server(tiny_engine) as url:
        body = {"model": "m", "prompt": "Hi", "response_format": schema_format(schema)}
        refused = await post(url, "completions", body)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_params", "response_format")
    assert error["message"] == f"response_format.json_schema.schema {message}"


async def test_a_bounded_schema_holds_a_completion_too(tiny_engine: HFEngine) -> None:
    async with running_server(tiny_engine) as url:
        body = {"model": "m", "prompt": "Colour:", "response_format": schema_format(BOUNDED)}
        answer = await post(url, "completions", body | {"max_tokens": 32})
    choice = answer.json()["choices"][0]
    assert json.loads(choice["text"])["colour"] in ("red", "green", "blue")
    assert choice["finish_reason"] == "stop"


def check_chat_entries(entries: list[Any], top: int) -> None:
    for entry in entries:
        assert isinstance(entry.logprob, float) and entry.logprob <= 0
        assert entry.bytes == list(entry.token.encode())
        values = [alt.logprob for alt in entry.top_logprobs]
        assert len(values) == top and values == sorted(values, reverse=True)


async def test_chat_logprobs_come_one_per_token_whole_and_streamed(tiny_engine: HFEngine) -> None:
    async with running_server(tiny_engine) as url, async_client(url) as client:
        whole = await client.chat.completions.create(
            model="m", messages=[user("Hi")], max_tokens=10, logprobs=True, top_logprobs=3
        )
        stream = await client.chat.completions.create(
            model="m",
            messages=[user("Hi")],
            max_tokens=10,
            logprobs=True,
            top_logprobs=3,
            stream=True,
        )
        streamed: list[Any] = []
        async with asyncio.timeout(TIMEOUT):
            async for chunk in stream:
                for part in chunk.choices:
                    if part.logprobs is not None and part.logprobs.content:
                        streamed += part.logprobs.content
        plain = await client.chat.completions.create(
            model="m", messages=[user("Hi")], max_tokens=10
        )
    choice = whole.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    entries = choice.logprobs.content
    assert whole.usage is not None and len(entries) == whole.usage.completion_tokens == 10
    # a special token (the random model picks some) is shown by name, and is no text
    shown = "".join(entry.token for entry in entries)
    assert re.sub(r"<unused\d+>", "", shown) == choice.message.content
    check_chat_entries(entries, 3)
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in entries]
    assert plain.choices[0].logprobs is None  # none asked, none computed
    assert plain.choices[0].message.content == choice.message.content


async def test_completion_logprobs_come_in_the_legacy_shape(tiny_engine: HFEngine) -> None:
    async with running_server(tiny_engine) as url, async_client(url) as client:
        whole = await client.completions.create(model="m", prompt="Hi", max_tokens=6, logprobs=2)
        stream = await client.completions.create(
            model="m", prompt="Hi", max_tokens=6, logprobs=2, stream=True
        )
        offsets: list[int] = []
        async with asyncio.timeout(TIMEOUT):
            async for chunk in stream:
                for choice in chunk.choices:
                    if choice.logprobs is not None:
                        offsets += choice.logprobs.text_offset or []
    logprobs = whole.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    shown = "".join(logprobs.tokens)
    assert len(logprobs.tokens) == 6 and re.sub(r"<unused\d+>", "", shown) == whole.choices[0].text
    assert logprobs.token_logprobs is not None and all(v <= 0 for v in logprobs.token_logprobs)
    assert logprobs.top_logprobs is not None
    assert [len(top) for top in logprobs.top_logprobs] == [2] * 6
    assert offsets == logprobs.text_offset


class Colour(BaseModel):
    name: Literal["red", "green", "blue", "yellow"]
    warm: bool


class Fruit(BaseModel):
    name: str = Field(max_length=20)
    colour: Colour
    calories: int = Field(ge=0, le=500)


@pytest.mark.real_model
async def test_a_strict_json_schema_reply_parses_into_a_pydantic_model_on_the_embedded_model() -> (
    None
):
    from tests.e2e.test_real_model_answers import embedded_engine

    async with asyncio.timeout(600):  # converts the GGUF on first use (about a minute)
        engine = await asyncio.to_thread(embedded_engine)
    try:
        async with running_server(engine) as url, async_client(url) as client:
            for text in ("Describe a banana.", "Describe a cherry.", "Describe a lime."):
                completion = await client.chat.completions.parse(
                    model="m",
                    messages=[user(text)],
                    response_format=Fruit,
                    max_tokens=96,
                )
                choice = completion.choices[0]
                assert choice.finish_reason == "stop", choice.message.content
                assert isinstance(choice.message.parsed, Fruit)
    finally:
        await engine.aclose()
