"""The browser-facing endpoints against a real uvicorn: pages, static modules, ``/metrics`` and
the ``/v1/stats`` socket, read by plain HTTP and WebSocket clients."""

from __future__ import annotations

import asyncio
import hashlib

import httpx
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families
from websockets.typing import Origin, Subprotocol
from wschat.protocol import HISTORY_SERIES, Stats, decode_server_frame
from wschat.server.sessions.hub import Hub
from wschat.server.settings import Settings
from wschat.server.web.stats_feed import HISTORY_SAMPLES, StatsFeed, sample

from tests.fakes.scripted import Script, ScriptedEngine
from tests.prometheus import samples
from tests.support import (
    SUBPROTOCOL,
    TIMEOUT,
    next_stats,
    raw_peer,
    running_server,
    stats_socket,
)

METRIC_TYPES = {
    "wschat_time_to_first_token_seconds": "histogram",
    "wschat_inter_token_latency_seconds": "histogram",
    "wschat_request_queue_seconds": "histogram",
    "wschat_prompt_tokens": "counter",
    "wschat_cached_prompt_tokens": "counter",
    "wschat_generation_tokens": "counter",
    "wschat_cancellations": "counter",
    "wschat_errors": "counter",
    "wschat_generations_running": "gauge",
    "wschat_generations_queued": "gauge",
    "wschat_sessions_active": "gauge",
    "wschat_model_info": "gauge",
}


def base(url: str) -> str:
    return url.replace("ws://", "http://").removesuffix("/v1/chat")


async def test_stats_socket_sends_a_snapshot_at_once_with_the_live_session_table() -> None:
    engine = ScriptedEngine(lambda request: Script([" a", " b", " c"]))
    async with running_server(engine) as url, stats_socket(url) as ws:
        first = await next_stats(ws)
        assert (first.sessions, first.running, first.queued, first.live) == (0, 0, 0, ())
        assert (first.model, first.device, first.kv_tokens) == ("scripted", "cpu", None)
        async with raw_peer(url) as (peer, ready):
            await peer.send({"type": "prompt", "id": "a", "text": "hi"})
            await peer.recv_until("done")
            await peer.send({"type": "cancel", "id": "nope"})  # not_running: an error counted
            await peer.recv_until("error")
            row = {
                "id": hashlib.sha256(ready["session"].encode()).hexdigest()[:10],
                "state": "idle",
                "tokens": 3,
                "turns": 1,
                "reply": None,
                "api": "websocket",
            }
            while (stats := await next_stats(ws)).errors != {"not_running": 1}:
                pass
            assert stats.live == (row,)
            assert stats.sessions == 1 and stats.tokens_per_s > 0
            assert stats.ttft_p50_ms is not None and stats.ttft_p95_ms is not None
            assert ready["session"] not in repr(stats.to_wire())


async def test_metrics_expose_every_documented_name_with_its_type() -> None:
    async with running_server(ScriptedEngine()) as url, httpx.AsyncClient(timeout=TIMEOUT) as http:
        response = await http.get(base(url) + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    types = {f.name: f.type for f in text_string_to_metric_families(response.text)}
    assert {name: types.get(name) for name in METRIC_TYPES} == METRIC_TYPES
    assert "process_cpu_seconds_total" not in response.text  # our registry, not the global one


async def test_metrics_of_two_apps_in_one_process_stay_apart() -> None:
    script = ScriptedEngine(lambda request: Script([" x"] * 5, delay_s=0.005))
    async with (
        running_server(script) as busy,
        running_server(ScriptedEngine()) as quiet,
        httpx.AsyncClient(timeout=TIMEOUT) as http,
    ):
        async with raw_peer(busy) as (peer, _):
            await peer.send({"type": "prompt", "id": "a", "text": "hi"})
            await peer.recv_until("done")
            await peer.send({"type": "prompt", "id": "b", "text": "stop me"})
            await peer.send({"type": "cancel", "id": "b"})
            await peer.recv_until("done")
            await peer.send({"type": "prompt", "id": "c", "text": ""})  # invalid_params
            await peer.recv_until("error")
            one = samples((await http.get(base(busy) + "/metrics")).text)
        other = samples((await http.get(base(quiet) + "/metrics")).text)
    assert one["wschat_time_to_first_token_seconds_count"] >= 1
    assert one["wschat_generation_tokens_total"] >= 5
    assert one["wschat_request_queue_seconds_count"] == 2
    assert one["wschat_cancellations_total"] == 1
    assert one["wschat_errors_total{code=invalid_params}"] == 1
    assert one["wschat_sessions_active"] == 1
    assert 4 <= one["wschat_inter_token_latency_seconds_count"] <= 4 + 4  # a: 4 gaps; b: 0-4
    assert other["wschat_time_to_first_token_seconds_count"] == 0
    assert other["wschat_generation_tokens_total"] == 0
    assert other["wschat_sessions_active"] == 0
    assert other["wschat_model_info{device=cpu,dtype=none,model=scripted}"] == 1


@pytest.mark.parametrize(
    ("path", "media_type"),
    [
        ("/", "text/html"),
        ("/dashboard", "text/html"),
        ("/static/app.js", "text/javascript"),
        ("/static/dashboard.js", "text/javascript"),
        ("/static/msgpack.js", "text/javascript"),
        ("/static/vendor/msgpack/index.mjs", "text/javascript"),
        ("/static/vendor/msgpack/utils/utf8.mjs", "text/javascript"),
        ("/static/markdown.js", "text/javascript"),
        ("/static/vendor/markdown-it.min.js", "text/javascript"),
        ("/static/style.css", "text/css"),
    ],
)
async def test_pages_and_modules_are_served_from_the_package(path: str, media_type: str) -> None:
    async with running_server(ScriptedEngine()) as url, httpx.AsyncClient(timeout=TIMEOUT) as http:
        response = await http.get(base(url) + path)
        missing = await http.get(base(url) + "/static/nothing-here.js")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith(media_type)
    assert missing.status_code == 404
    if media_type == "text/html":
        assert "default-src 'self'" in response.headers["content-security-policy"]
        assert "https://" not in response.text  # no CDN: everything comes from this server


async def test_auth_check_says_ok_on_a_server_without_tokens() -> None:
    async with running_server(ScriptedEngine()) as url, httpx.AsyncClient(timeout=TIMEOUT) as http:
        response = await http.get(base(url) + "/v1/auth")
    assert (response.status_code, response.json()) == (200, {"ok": True, "tokens": False})


async def test_stats_socket_ends_when_its_peer_leaves_and_the_server_stops_cleanly() -> None:
    async with running_server(ScriptedEngine()) as url:
        for _ in range(3):
            async with stats_socket(url) as ws:
                await next_stats(ws)
    # leaving running_server (within its timeout) proves no stats loop kept the server up


async def test_metrics_auth_check_and_stats_follow_the_servers_tokens() -> None:
    async with (
        running_server(ScriptedEngine(), tokens=("secret",)) as url,
        httpx.AsyncClient(base_url=base(url), timeout=TIMEOUT) as http,
    ):
        good = {"Authorization": "Bearer secret"}
        assert (await http.get("/metrics")).status_code == 401
        assert (await http.get("/metrics", headers=good)).status_code == 200
        missing = await http.get("/v1/auth")
        wrong = await http.get("/v1/auth", headers={"Authorization": "Bearer nope"})
        right = await http.get("/v1/auth", headers=good)
        assert (missing.status_code, missing.json()["token_given"]) == (401, False)
        assert (wrong.status_code, wrong.json()["token_given"]) == (401, True)
        assert (right.status_code, right.json()) == (200, {"ok": True, "tokens": True})
        stats_url = url.replace("/v1/chat", "/v1/stats")
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with asyncio.timeout(TIMEOUT):
                await websockets.connect(stats_url)
        assert refused.value.response.status_code == 401
        async with asyncio.timeout(TIMEOUT):
            ws = await websockets.connect(
                stats_url, subprotocols=[SUBPROTOCOL, Subprotocol("bearer.secret")]
            )
        try:
            assert ws.subprotocol == "wschat.v1"
            assert (await next_stats(ws)).model == "scripted"
        finally:
            async with asyncio.timeout(TIMEOUT):
                await ws.close()


async def test_stats_socket_refuses_an_origin_outside_the_allow_list() -> None:
    allowed = Origin("http://dash.example")
    async with running_server(ScriptedEngine(), allowed_origins=(allowed,)) as url:
        stats_url = url.replace("/v1/chat", "/v1/stats")
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with asyncio.timeout(TIMEOUT):
                await websockets.connect(stats_url, origin=Origin("http://elsewhere.example"))
        assert refused.value.response.status_code == 403
        async with asyncio.timeout(TIMEOUT):
            ws = await websockets.connect(stats_url, origin=allowed)
        try:
            await next_stats(ws)
        finally:
            async with asyncio.timeout(TIMEOUT):
                await ws.close()


async def test_a_new_stats_socket_gets_the_seconds_before_it_in_its_first_frame() -> None:
    engine = ScriptedEngine(lambda request: Script([f" w{i}" for i in range(30)], delay_s=0.1))
    async with running_server(engine) as url:
        async with raw_peer(url) as (peer, _):  # about 3 s of tokens, sampled each second
            await peer.send({"type": "prompt", "id": "a", "text": "hi"})
            await peer.recv_until("done")
        async with stats_socket(url) as ws:
            first, second = await next_stats(ws), await next_stats(ws)
    assert first.history is not None and second.history is None
    assert list(first.history) == list(HISTORY_SERIES)
    lengths = {len(series) for series in first.history.values()}
    assert len(lengths) == 1 and 2 <= lengths.pop() <= HISTORY_SAMPLES
    assert max(v or 0 for v in first.history["tokens_per_s"]) > 0  # the reply was sampled
    assert all(v is not None for v in first.history["running"])


async def test_the_samples_kept_for_new_dashboards_are_bounded() -> None:
    hub = Hub(Settings())
    feed = StatsFeed(hub)
    for _ in range(3 * HISTORY_SAMPLES):
        feed.samples.append(sample(hub))
    history = decode_server_frame(feed.first_frame())
    assert isinstance(history, Stats) and history.history is not None
    assert {len(series) for series in history.history.values()} == {HISTORY_SAMPLES}
