"""A response's life over HTTP (web/responses/routes.py), read raw: in progress, then kept as it
ended, deleted or cancelled by id; one that fails mid-stream ends ``response.failed``, and a
failure before its stream is an error in OpenAI's shape; ``store: false`` keeps nothing."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx
import pytest

from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import TIMEOUT, http_base, running_server, wait_until

LONG = 1000  # max_output_tokens that asks the scripted engine for a reply slower than any test


def script(request: Any) -> Script:
    """Four words; for ``LONG`` tokens, minutes of them; for 13, a failure after two."""
    n = request.params.max_new_tokens
    if n == 13:
        return Script([" a", " b", " c"], fail_after=2)
    return Script([f" w{i}" for i in range(n if n >= LONG else 4)], delay_s=0.02)


def events_of(raw: str) -> list[dict[str, Any]]:
    return [json.loads(block.split("\ndata: ", 1)[1]) for block in raw.split("\n\n") if block]


async def test_a_response_is_in_progress_then_kept_then_deleted() -> None:
    engine = ScriptedEngine(script)
    async with (
        running_server(engine) as url,
        httpx.AsyncClient(base_url=http_base(url), timeout=TIMEOUT) as http,
    ):
        body = {"model": "any", "input": "Hi", "max_output_tokens": LONG, "stream": True}
        async with http.stream("POST", "/v1/responses", json=body) as stream:
            lines = stream.aiter_lines()
            while not (line := await anext(lines)).startswith("data: "):
                pass
            response_id = json.loads(line.removeprefix("data: "))["response"]["id"]
            running = await http.get(f"/v1/responses/{response_id}")
            refused = await http.delete(f"/v1/responses/{response_id}")
            cancelled = await http.post(f"/v1/responses/{response_id}/cancel")
            rest = "".join([line + "\n" async for line in lines])
        kept = await http.get(f"/v1/responses/{response_id}")
        again = await http.post(f"/v1/responses/{response_id}/cancel")
        done = (await http.post("/v1/responses", json={"model": "any", "input": "Hi"})).json()
        not_cancelled = await http.post(f"/v1/responses/{done['id']}/cancel")
        deleted = await http.delete(f"/v1/responses/{done['id']}")
        gone = await http.get(f"/v1/responses/{done['id']}")
    assert running.status_code == 200 and running.json()["status"] == "in_progress"
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == (
        f"response {response_id!r} has not ended: cancel it first"
    )
    assert cancelled.json()["status"] == "cancelled"
    assert events_of(rest)[-1]["type"] == "response.incomplete"
    assert kept.json() == again.json() == cancelled.json()
    assert not_cancelled.status_code == 400
    assert not_cancelled.json()["error"]["message"] == (
        f"response {done['id']!r} has already ended (completed)"
    )
    assert deleted.json() == {"id": done["id"], "object": "response.deleted", "deleted": True}
    assert gone.status_code == 404
    assert not engine.threads


async def test_a_response_that_fails_mid_stream_ends_failed_with_its_error() -> None:
    async with (
        running_server(ScriptedEngine(script)) as url,
        httpx.AsyncClient(base_url=http_base(url), timeout=TIMEOUT) as http,
    ):
        body = {"model": "any", "input": "Hi", "max_output_tokens": 13}
        streamed = await http.post("/v1/responses", json={**body, "stream": True})
        whole = await http.post("/v1/responses", json=body)
        events = events_of(streamed.text)
        kept = await http.get(f"/v1/responses/{events[0]['response']['id']}")
    assert [e["type"] for e in events][-2:] == ["response.output_item.done", "response.failed"]
    failed = events[-1]["response"]
    assert failed["status"] == kept.json()["status"] == "failed"
    assert failed["error"] == {"code": "server_error", "message": "generation failed"}
    assert failed["output"][0]["status"] == "incomplete"
    assert failed["output"][0]["content"][0]["text"] == " a b"
    assert whole.status_code == 500
    assert whole.json() == {
        "error": {
            "message": "generation failed",
            "type": "server_error",
            "param": None,
            "code": "internal",
        }
    }


async def test_store_false_keeps_nothing_and_a_continuation_of_it_is_not_found() -> None:
    async with (
        running_server(ScriptedEngine(script)) as url,
        httpx.AsyncClient(base_url=http_base(url), timeout=TIMEOUT) as http,
    ):
        made = await http.post(
            "/v1/responses", json={"model": "any", "input": "Hi", "store": False}
        )
        response_id = made.json()["id"]
        got = await http.get(f"/v1/responses/{response_id}")
        body = {"model": "any", "input": "Hi", "previous_response_id": response_id}
        went_on = await http.post("/v1/responses", json=body)
    assert made.status_code == 200 and made.json()["store"] is False
    assert got.status_code == 404
    assert went_on.status_code == 400
    assert went_on.json()["error"]["code"] == "previous_response_not_found"


async def test_a_client_that_leaves_a_whole_response_cancels_it() -> None:
    engine = ScriptedEngine(script)
    async with running_server(engine, max_concurrent=1) as url:
        async with httpx.AsyncClient(base_url=http_base(url), timeout=TIMEOUT) as http:
            body = {"model": "any", "input": "Hi", "max_output_tokens": LONG}
            waiting = asyncio.create_task(http.post("/v1/responses", json=body))
            await wait_until(lambda: engine.threads)
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
        await wait_until(lambda: not engine.threads)
        async with httpx.AsyncClient(base_url=http_base(url), timeout=TIMEOUT) as http:
            after = await http.post("/v1/responses", json={"model": "any", "input": "Hi"})
    assert after.json()["output"][0]["content"][0]["text"] == " w0 w1 w2 w3"


async def test_a_refused_lookup_is_answered_and_logged_as_no_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with (
        running_server(ScriptedEngine()) as url,
        httpx.AsyncClient(base_url=http_base(url), timeout=TIMEOUT) as http,
    ):
        got = await http.get("/v1/responses/resp_unknown")
        deleted = await http.delete("/v1/responses/resp_unknown")
        cancelled = await http.post("/v1/responses/resp_unknown/cancel")
    for answer in (got, deleted, cancelled):
        assert answer.status_code == 404
        assert answer.json()["error"]["message"] == "No response found with id 'resp_unknown'."
    # a client's refusal is not a failure of ours: no error, no traceback in the log
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
