"""``GET /v1/models`` and ``/v1/models/{id}`` through the official SDK (web/openai_api/models.py):
the model served has a short id (its name without the description in parentheses), which the
list, a retrieve and every reply name; a retrieve takes the id or the whole name, and an
unknown id is 404 ``model_not_found`` in OpenAI's shape."""

from __future__ import annotations

import dataclasses

import openai
import pytest

from tests.api.support import async_client, user
from tests.fakes.scripted import ScriptedEngine
from tests.support import running_server

NAME = "gemma-3-270m (embedded, from GGUF Q4_K_M)"  # the embedded model's (engine/local/loader.py)


def described() -> ScriptedEngine:
    engine = ScriptedEngine()
    engine.info = dataclasses.replace(engine.info, model=NAME)
    return engine


async def test_the_model_list_and_a_retrieve_give_the_short_id_and_the_description() -> None:
    async with running_server(described()) as url, async_client(url) as client:
        listed = await client.models.list()
        by_id = await client.models.retrieve("gemma-3-270m")
        by_name = await client.models.retrieve(NAME)
    (model,) = listed.data
    for found in (model, by_id, by_name):
        assert (found.id, found.object, found.owned_by) == ("gemma-3-270m", "model", "wschat")
        assert found.model_extra == {"description": NAME}
    assert abs(by_id.created - model.created) <= 1


async def test_a_reply_names_the_short_id_whichever_id_the_request_gave() -> None:
    async with running_server(described()) as url, async_client(url) as client:
        replies = [
            await client.chat.completions.create(model=model, messages=[user("Hi")])
            for model in ("gemma-3-270m", NAME)
        ]
        completion = await client.completions.create(model=NAME, prompt="Once")
    assert [r.model for r in replies] == ["gemma-3-270m", "gemma-3-270m"]
    assert completion.model == "gemma-3-270m"


async def test_an_unknown_model_is_404_model_not_found() -> None:
    async with running_server(described()) as url, async_client(url) as client:
        with pytest.raises(openai.NotFoundError) as missing:
            await client.models.retrieve("gpt-4o")
    assert missing.value.status_code == 404
    assert missing.value.body == {
        "message": "the model 'gpt-4o' does not exist; this server serves 'gemma-3-270m'",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }


async def test_a_model_without_a_description_is_listed_under_its_name() -> None:
    async with running_server(ScriptedEngine()) as url, async_client(url) as client:
        (model,) = (await client.models.list()).data
    assert model.id == "scripted" and model.model_extra == {}
