"""CORS on the API's routes (web/openai_api/cors.py), read raw from a real uvicorn: a preflight
from an ``--allowed-origin`` is answered without the token and runs nothing, one from another
origin is 403 without CORS headers, and every response to an allowed origin (whole, streamed, 401,
429) is marked readable by it. Without ``--allowed-origin`` no CORS header is sent."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.api.test_routes import LONG, body, metric, slow_when_long
from tests.fakes.scripted import ScriptedEngine
from tests.support import TIMEOUT, http_base, running_server, wait_until

ORIGIN = "http://app.example:8080"
# listed as a user might type it: the comparison is the WebSocket's (case folded, no final slash)
LISTED = ("http://App.example:8080/",)
TOKEN = "sekrit"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# what the openai JS SDK asks for on its preflight
SDK_HEADERS = "authorization,content-type,x-stainless-arch,x-stainless-lang,x-stainless-os"
ROUTES = [("/v1/chat/completions", "POST"), ("/v1/completions", "POST"), ("/v1/models", "GET")]


async def preflight(base: str, path: str, method: str, origin: str) -> httpx.Response:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": SDK_HEADERS,
    }
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        return await http.options(f"{base}{path}", headers=headers)


def cors_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.startswith("access-control-")}


def assert_readable_by(response: httpx.Response, origin: str) -> None:
    assert cors_headers(response) == {
        "access-control-allow-origin": origin,
        "access-control-expose-headers": "Retry-After",
    }
    assert "Origin" in response.headers["vary"]


@pytest.mark.parametrize(("path", "method"), ROUTES)
async def test_a_preflight_from_an_allowed_origin_is_204_with_what_it_asked_and_no_token(
    path: str, method: str
) -> None:
    engine = ScriptedEngine()
    async with running_server(engine, allowed_origins=LISTED, tokens=(TOKEN,)) as url:
        answered = await preflight(http_base(url), path, method, ORIGIN)
        generations = await metric(http_base(url), 'wschat_generations_total{api="openai"}')
    assert answered.status_code == 204, answered.text
    assert cors_headers(answered) == {
        "access-control-allow-origin": ORIGIN,
        "access-control-allow-methods": method,
        "access-control-allow-headers": SDK_HEADERS.replace(",", ", "),
        "access-control-max-age": "600",
    }
    assert answered.headers["vary"] == "Origin"
    assert engine.requests == [] and generations == 0


async def test_a_preflight_from_another_origin_is_403_without_cors_headers() -> None:
    async with running_server(ScriptedEngine(), allowed_origins=LISTED, tokens=(TOKEN,)) as url:
        refused = await preflight(
            http_base(url), "/v1/chat/completions", "POST", "https://evil.example"
        )
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "forbidden"
    assert cors_headers(refused) == {}


async def test_a_preflight_naming_a_foreign_host_is_403_without_cors_headers() -> None:
    async with running_server(ScriptedEngine(), allowed_origins=LISTED) as url:
        headers = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            # no token set: the Host check stops DNS rebinding, a preflight included
            refused = await http.options(
                f"{http_base(url)}/v1/chat/completions",
                headers={**headers, "Host": "rebound.example"},
            )
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "forbidden"
    assert cors_headers(refused) == {}


async def test_a_preflight_for_a_method_the_route_lacks_is_405_without_cors_headers() -> None:
    async with running_server(ScriptedEngine(), allowed_origins=LISTED) as url:
        refused = await preflight(http_base(url), "/v1/chat/completions", "DELETE", ORIGIN)
    assert refused.status_code == 405
    assert cors_headers(refused) == {}


async def test_without_allowed_origins_the_api_sends_no_cors_headers() -> None:
    async with running_server(ScriptedEngine()) as url:
        base = http_base(url)
        refused = await preflight(base, "/v1/chat/completions", "POST", ORIGIN)
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            # a page of the server's own origin: answered as ever, no CORS needed
            same = await http.post(
                f"{base}/v1/chat/completions", json=body(), headers={"Origin": base}
            )
    assert refused.status_code == 403 and cors_headers(refused) == {}
    assert same.status_code == 200 and cors_headers(same) == {}


async def test_replies_to_an_allowed_origin_are_readable_by_it() -> None:
    async with running_server(ScriptedEngine(), allowed_origins=LISTED, tokens=(TOKEN,)) as url:
        endpoint = f"{http_base(url)}/v1/chat/completions"
        headers = {"Origin": ORIGIN, **AUTH}
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            whole = await http.post(endpoint, json=body(), headers=headers)
            models = await http.get(f"{http_base(url)}/v1/models", headers=headers)
            unauthorized = await http.post(endpoint, json=body(), headers={"Origin": ORIGIN})
            payload = body(stream=True)
            async with http.stream("POST", endpoint, json=payload, headers=headers) as streamed:
                events = [line async for line in streamed.aiter_lines() if line]
            no_origin = await http.post(endpoint, json=body(), headers=AUTH)
    assert whole.status_code == 200 and whole.json()["choices"][0]["message"]["content"]
    assert streamed.status_code == 200 and events[-1] == "data: [DONE]"
    assert models.status_code == 200 and unauthorized.status_code == 401
    for response in (whole, models, unauthorized, streamed):
        assert_readable_by(response, ORIGIN)
    assert no_origin.status_code == 200 and cors_headers(no_origin) == {}


async def test_a_429_to_an_allowed_origin_exposes_its_retry_after() -> None:
    engine = ScriptedEngine(slow_when_long)
    settings: dict[str, Any] = {"max_concurrent": 1, "max_queue": 0}
    async with running_server(engine, allowed_origins=LISTED, **settings) as url:
        endpoint = f"{http_base(url)}/v1/chat/completions"
        origin = {"Origin": ORIGIN}
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            running = asyncio.create_task(
                http.post(endpoint, json=body(max_tokens=LONG), headers=origin)
            )
            await wait_until(lambda: engine.requests)
            refused = await http.post(endpoint, json=body(), headers=origin)
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert_readable_by(refused, ORIGIN)
