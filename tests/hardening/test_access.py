"""Bearer tokens in each of their three forms, Origin checks, and logs that never show either."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import websockets

from tests.fakes.scripted import ScriptedEngine
from tests.support import (
    TIMEOUT,
    RawPeer,
    closed_before_ready,
    http_base,
    raw_peer,
    running_server,
)

TOKEN = "s3cret-token-value"


async def handshake_status(url: str, **kwargs: Any) -> int:
    """The HTTP status a refused handshake got (fails if it was accepted)."""
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with asyncio.timeout(TIMEOUT):
            ws = await websockets.connect(url, **kwargs)
            await ws.close()
    return refused.value.response.status_code


async def chat_works(url: str, **kwargs: Any) -> None:
    async with asyncio.timeout(TIMEOUT):
        ws = await websockets.connect(url, **kwargs)
    try:
        peer = RawPeer(ws)
        assert (await peer.recv())["type"] == "ready"
        assert ws.subprotocol == "wschat.v1"
        await peer.send({"type": "prompt", "id": "p", "text": "hi"})
        assert (await peer.recv_until("done"))[-1]["reason"] == "stop"
    finally:
        async with asyncio.timeout(TIMEOUT):
            await ws.close()


@pytest.mark.parametrize(
    "how",
    [
        {"additional_headers": {"Authorization": f"Bearer {TOKEN}"}},
        {"subprotocols": ["wschat.v1", f"bearer.{TOKEN}"]},
        {"query": f"?token={TOKEN}"},
    ],
    ids=["authorization-header", "subprotocol", "query-string"],
)
async def test_a_right_token_is_accepted_in_each_of_its_three_forms(how: dict[str, Any]) -> None:
    kwargs = dict(how)
    query = kwargs.pop("query", "")
    kwargs.setdefault("subprotocols", ["wschat.v1"])
    async with running_server(ScriptedEngine(), tokens=("other", TOKEN)) as url:
        await chat_works(url + query, **kwargs)


async def test_a_missing_or_wrong_token_is_refused_with_401_in_the_handshake() -> None:
    async with running_server(ScriptedEngine(), tokens=(TOKEN,)) as url:
        assert await handshake_status(url, subprotocols=["wschat.v1"]) == 401
        assert await handshake_status(url + "?token=nope") == 401
        wrong_header = {"Authorization": f"Bearer {TOKEN}x"}
        assert await handshake_status(url, additional_headers=wrong_header) == 401
        assert await handshake_status(url, subprotocols=["wschat.v1", "bearer.s3cret"]) == 401
        # a refused handshake costs the server nothing: the right token still gets in
        await chat_works(url, subprotocols=["wschat.v1", f"bearer.{TOKEN}"])


async def test_health_endpoints_stay_open_and_metrics_need_the_token() -> None:
    async with (
        running_server(ScriptedEngine(), tokens=(TOKEN,)) as url,
        httpx.AsyncClient(base_url=http_base(url), timeout=TIMEOUT) as http,
    ):
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/readyz")).status_code == 200
        assert (await http.get("/metrics")).status_code == 401
        assert (await http.get(f"/metrics?token={TOKEN}")).status_code == 200


async def test_a_foreign_origin_is_refused_with_403_even_with_the_right_token() -> None:
    allowed = "https://chat.example.com"
    async with running_server(ScriptedEngine(), tokens=(TOKEN,), allowed_origins=(allowed,)) as url:
        good = ["wschat.v1", f"bearer.{TOKEN}"]
        assert await handshake_status(url, origin="https://evil.example", subprotocols=good) == 403
        assert await handshake_status(url, origin="null", subprotocols=good) == 403
        await chat_works(url, origin=allowed, subprotocols=good)
        await chat_works(url, subprotocols=good)  # no Origin: not a browser


async def test_without_an_allow_list_only_same_host_origins_are_accepted() -> None:
    async with running_server(ScriptedEngine()) as url:
        host = url.removeprefix("ws://").split("/")[0]
        assert await handshake_status(url, origin="http://evil.example") == 403
        assert await handshake_status(url, origin=f"http://{host}.evil.example") == 403
        await chat_works(url, origin=f"http://{host}", subprotocols=["wschat.v1"])


@contextmanager
def captured(logger_name: str) -> Iterator[list[str]]:
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Collect(level=logging.DEBUG)
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


async def test_tokens_and_query_strings_never_reach_the_logs() -> None:
    async with running_server(ScriptedEngine(), tokens=(TOKEN,), log_level="debug") as url:
        with captured("uvicorn.error") as uvicorn_lines, captured("wschat") as our_lines:
            await chat_works(url + f"?token={TOKEN}&resume=abc", subprotocols=["wschat.v1"])
            await chat_works(url, subprotocols=["wschat.v1", f"bearer.{TOKEN}"])
            header = {"Authorization": f"Bearer {TOKEN}"}
            await chat_works(url, additional_headers=header, subprotocols=["wschat.v1"])
            await handshake_status(url + "?token=wrong-one")
    lines = uvicorn_lines + our_lines
    assert any("/v1/chat" in line for line in lines), "the handshakes were not logged at all"
    assert not [line for line in lines if TOKEN in line or "wrong-one" in line or "resume=" in line]


async def test_a_token_sent_where_it_is_not_read_never_reaches_the_debug_log() -> None:
    async with running_server(ScriptedEngine(), tokens=(TOKEN,), log_level="debug") as url:
        with captured("uvicorn.error") as lines:
            for headers in (
                {"Cookie": f"wschat_token={TOKEN}; theme=dark"},
                {"X-Api-Key": TOKEN},
                {"X-Auth": f"Bearer {TOKEN}"},
                {"Proxy-Authorization": f"Bearer {TOKEN}"},
            ):
                assert await handshake_status(url, additional_headers=headers) == 401
    headers_logged = [line for line in lines if line.startswith("< ")]
    assert {"< cookie: …", "< x-api-key: …", "< x-auth: …"} <= set(headers_logged)
    assert not [line for line in lines if TOKEN in line]


def chat_url_for_host(url: str, host: str) -> tuple[str, dict[str, Any]]:
    """A URL naming ``host`` (the Host header a browser sends) and how to reach the server."""
    port = int(url.removeprefix("ws://").split("/")[0].split(":")[1])
    return f"ws://{host}:{port}/v1/chat", {"host": "127.0.0.1", "port": port}


async def test_without_a_token_a_rebound_host_name_cannot_reach_chat_stats_or_metrics() -> None:
    # DNS rebinding: a page from http://rebound.example:PORT whose name now resolves to 127.0.0.1
    async with running_server(ScriptedEngine()) as url:
        rebound, route = chat_url_for_host(url, "rebound.example")
        origin = rebound.replace("ws://", "http://").removesuffix("/v1/chat")
        assert await handshake_status(rebound, origin=origin, **route) == 403
        stats = rebound.replace("/v1/chat", "/v1/stats")
        assert await handshake_status(stats, origin=origin, **route) == 403
        async with httpx.AsyncClient(base_url=http_base(url), timeout=TIMEOUT) as http:
            headers = {"Host": f"rebound.example:{route['port']}"}
            assert (await http.get("/metrics", headers=headers)).status_code == 403
            assert (await http.get("/v1/auth", headers=headers)).status_code == 403
            assert (await http.get("/metrics")).status_code == 200
        for name in ("localhost", "app.localhost", "127.0.0.1", "[::1]"):
            local, route = chat_url_for_host(url, name)
            await chat_works(local, subprotocols=["wschat.v1"], **route)


async def test_allowed_host_lets_a_name_in_and_a_token_makes_the_host_check_unneeded() -> None:
    async with running_server(ScriptedEngine(), allowed_hosts=("chat.example",)) as url:
        named, route = chat_url_for_host(url, "chat.example")
        await chat_works(named, subprotocols=["wschat.v1"], **route)
        other, route = chat_url_for_host(url, "other.example")
        assert await handshake_status(other, **route) == 403
    async with running_server(ScriptedEngine(), tokens=(TOKEN,)) as url:
        named, route = chat_url_for_host(url, "chat.example")
        await chat_works(named, subprotocols=["wschat.v1", f"bearer.{TOKEN}"], **route)


async def test_x_forwarded_for_from_an_untrusted_peer_changes_neither_caps_nor_logs() -> None:
    async with running_server(
        ScriptedEngine(), max_connections_per_client=2, log_level="info"
    ) as url:
        with captured("uvicorn.error") as lines:
            async with (
                raw_peer(url, additional_headers={"X-Forwarded-For": "10.0.0.1"}),
                raw_peer(url, additional_headers={"X-Forwarded-For": "10.0.0.2"}),
            ):
                spoofed = {"X-Forwarded-For": "10.0.0.3"}
                closed = await closed_before_ready(url, additional_headers=spoofed)
    assert closed == (1013, "too many connections from this address (2)")
    accepted = [line for line in lines if "[accepted]" in line]
    assert len(accepted) == 3
    assert all(line.startswith("127.0.0.1:") for line in accepted), accepted


async def test_x_forwarded_for_from_a_trusted_proxy_is_the_address_the_caps_see() -> None:
    def forwarded(address: str) -> dict[str, Any]:
        return {"additional_headers": {"X-Forwarded-For": address}}

    async with (
        running_server(
            ScriptedEngine(), max_connections_per_client=2, forwarded_allow_ips=("127.0.0.1",)
        ) as url,
        raw_peer(url, **forwarded("10.0.0.1")),
        raw_peer(url, **forwarded("10.0.0.1")),
    ):
        closed = await closed_before_ready(url, **forwarded("10.0.0.1"))
        assert closed == (1013, "too many connections from this address (2)")
        async with raw_peer(url, **forwarded("10.0.0.2")) as (peer, _):
            await peer.send({"type": "ping", "t": 1})
            assert (await peer.recv())["type"] == "pong"
