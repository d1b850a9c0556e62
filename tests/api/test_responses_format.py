"""``text.format`` on the Responses API through the official ``openai`` SDK against a real
uvicorn: a ``json_schema`` reply parses into a pydantic model (``responses.parse``, and on the
socket), held by the grammar the chat API's ``response_format`` is; a format the prompt frame's
checks refuse (naming ``text.format``), or a schema the grammar cannot enforce, is a 400 over HTTP
and an ``error`` event on the socket, which goes on."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any, Literal

import httpx
import pytest
from openai.types.responses import ResponseFormatTextJSONSchemaConfigParam
from pydantic import BaseModel

from tests.api.support import async_client
from tests.api.test_responses_wire import create, next_event, responses_socket, until_end
from tests.support import TIMEOUT, http_base, running_server

if TYPE_CHECKING:
    from wschat.server.engine.local.hf import HFEngine


class Choice(BaseModel):
    """A reply the grammar bounds, so the tiny model's random weights end it."""

    colour: Literal["red", "green", "blue"]
    ok: bool


def schema_format(schema: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    return {"type": "json_schema", "name": "choice", "schema": schema, "strict": strict}


CHOICE: ResponseFormatTextJSONSchemaConfigParam = {
    "type": "json_schema",
    "name": "choice",
    "schema": {
        "type": "object",
        "properties": {"colour": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
        "required": ["colour", "ok"],
        "additionalProperties": False,
    },
    "strict": True,
}
UNIQUE = {
    "type": "object",
    "properties": {"v": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}},
    "required": ["v"],
    "additionalProperties": False,
}


async def test_a_json_schema_reply_parses_into_a_pydantic_model(tiny_engine: HFEngine) -> None:
    async with running_server(tiny_engine) as url, async_client(url) as client:
        parsed = await client.responses.parse(
            model="any", input="Pick a colour.", text_format=Choice, max_output_tokens=32
        )
        async with client.responses.connect() as connection:
            await connection.response.create(
                model="any",
                input="Pick a colour.",
                text={"format": CHOICE},
                max_output_tokens=32,
                store=False,
            )
            async with asyncio.timeout(TIMEOUT):
                async for event in connection:
                    if event.type in ("response.completed", "response.incomplete", "error"):
                        break
    assert parsed.status == "completed", parsed.output_text
    assert isinstance(parsed.output_parsed, Choice)
    assert parsed.text is not None and parsed.text.format is not None
    assert parsed.text.format.type == "json_schema"
    assert event.type == "response.completed", event
    assert Choice.model_validate_json(event.response.output_text)
    assert event.response.text is not None and event.response.text.format is not None
    assert event.response.text.format.model_dump(exclude_none=True, by_alias=True) == CHOICE


async def test_json_object_holds_the_reply_to_an_object(tiny_engine: HFEngine) -> None:
    async with running_server(tiny_engine) as url, async_client(url) as client:
        response = await client.responses.create(
            model="any",
            input="An object.",
            text={"format": {"type": "json_object"}},
            max_output_tokens=64,
        )
    if response.status == "completed":
        assert isinstance(json.loads(response.output_text), dict)
    else:  # cut at max_output_tokens: an object's opening, never plain text
        assert response.output_text.lstrip().startswith("{")


@pytest.mark.parametrize(
    ("format_", "message", "param"),
    [
        (
            {"type": "json_schema", "name": "x"},
            "text.format.schema must be a map (a JSON schema)",
            "text.format",
        ),
        (
            {"type": "xml"},
            "text.format.type must be one of text, json_object, json_schema",
            "text.format",
        ),
        (
            {"type": "json_schema", "schema": {}, "colour": 1},
            "unknown key 'colour' in text.format",
            "text.format",
        ),
        # the grammar's refusal, in the words every engine tells a peer (the prompt frame's
        # params.response_format, which text.format is read into)
        (
            schema_format(UNIQUE),
            'response_format: the schema cannot be enforced: Unimplemented keys: ["uniqueItems"]',
            None,
        ),
    ],
)
async def test_a_format_refused_is_a_400_and_the_socket_goes_on(
    tiny_engine: HFEngine, format_: dict[str, Any], message: str, param: str | None
) -> None:
    body = {"model": "any", "input": "Hi", "max_output_tokens": 2, "text": {"format": format_}}
    async with (
        running_server(tiny_engine) as url,
        httpx.AsyncClient(timeout=TIMEOUT) as http,
        responses_socket(url) as ws,
    ):
        refused = await http.post(f"{http_base(url)}/v1/responses", json=body)
        await ws.send(create(**{k: v for k, v in body.items() if k != "model"}))
        event = await next_event(ws)
        await ws.send(create(max_output_tokens=2))
        after = await until_end(ws)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["message"], error["param"]) == ("invalid_params", message, param)
    assert event["type"] == "error" and event["error"] == error
    assert after[-1]["type"] == "response.incomplete"
