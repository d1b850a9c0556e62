"""``GET /v1/models`` and ``/v1/models/{id}`` through the official SDK (web/openai_api/models.py):
the model served, listed and retrieved in OpenAI's shape; an unknown id is 404
``model_not_found`` in OpenAI's error shape."""

from __future__ import annotations

import openai
import pytest

from tests.api.support import async_client
from tests.fakes.scripted import ScriptedEngine
from tests.support import running_server


async def test_the_model_list_and_a_retrieve_name_the_model_served() -> None:
    async with running_server(ScriptedEngine()) as url, async_client(url) as client:
        listed = await client.models.list()
        retrieved = await client.models.retrieve("scripted")
    (model,) = listed.data
    for found in (model, retrieved):
        assert (found.id, found.object, found.owned_by) == ("scripted", "model", "wschat")
    assert abs(retrieved.created - model.created) <= 1


async def test_an_unknown_model_is_404_model_not_found() -> None:
    async with running_server(ScriptedEngine()) as url, async_client(url) as client:
        with pytest.raises(openai.NotFoundError) as missing:
            await client.models.retrieve("gpt-4o")
    assert missing.value.status_code == 404
    assert missing.value.body == {
        "message": "the model 'gpt-4o' does not exist; this server serves 'scripted'",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
