"""The dashboard and ``/metrics`` after generations made through the chat page."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import httpx
import pytest
from playwright.async_api import expect
from wschat.server.engine.base import KVUsage
from wschat.server.engine.local.embedded_model import EMBEDDED_NAME

from tests.fakes.scripted import ScriptedEngine
from tests.prometheus import samples
from tests.support import TIMEOUT, raw_peer, running_server

from .chat import ChatPage
from .conftest import (
    PHONE,
    NewPage,
    anonymous_id,
    http_base,
    in_turn,
    lines,
    page_width,
    shown_whole,
    words,
)

pytestmark = pytest.mark.browser

NONZERO = re.compile(r"^(?!0\.0$)\d+\.\d$")


async def test_dashboard_shows_tokens_per_second_and_the_session_after_a_generation(
    new_page: NewPage, screenshots: Path
) -> None:
    # the first reply streams for a few seconds, so the charts have a shape in the screenshot
    engine = ScriptedEngine(in_turn(words(50, delay_s=0.1), words(6, delay_s=0.05)))
    async with running_server(engine) as url:
        base = http_base(url)
        dashboard = await new_page()
        await dashboard.goto(base + "/dashboard")
        await expect(dashboard.locator("#conn")).to_have_attribute("data-state", "connected")
        await expect(dashboard.locator("#t-tokens")).to_have_text("0.0")
        chat = await ChatPage(await new_page(), base).open()
        row = dashboard.locator(f'#sessions tr[data-id="{anonymous_id(await chat.session())}"]')
        await expect(row).to_contain_text("idle")
        first = await chat.send("first")
        await expect(row.locator("td").nth(1)).to_have_text("running")
        # the reply in flight is counted on its own, and within the session's count
        await expect(row.locator("td").nth(3)).to_have_text(re.compile(r"^[1-9]\d*$"))
        reply = int(await row.locator("td").nth(3).inner_text())
        assert reply <= int(await row.locator("td").nth(2).inner_text())
        assert await chat.finished(first) == "stop"
        assert await chat.finished(await chat.send("second")) == "stop"
        await expect(dashboard.locator("#t-tokens")).to_have_text(NONZERO)
        await expect(row.locator("td")).to_have_text(
            [anonymous_id(await chat.session()), "idle", "56", "\u2013", "2"]
        )
        await expect(dashboard.locator("#t-sessions")).to_have_text("1")
        await expect(dashboard.locator("#t-p50")).to_have_text(re.compile(r"^\d+ ms$"))
        await expect(dashboard.locator("#model")).to_have_text("scripted")
        await dashboard.screenshot(path=screenshots / "dashboard.png", full_page=True)


class KeepingEngine(ScriptedEngine):
    """Reports KV state held for idle sessions, as the batched engine does."""

    def kv_usage(self) -> KVUsage:  # type: ignore[override]
        return KVUsage(tokens=1_234_567, bytes=3_758_096_384, budget_bytes=8_589_934_592)


async def test_dashboard_says_its_token_counts_are_per_session_and_the_kv_tile_is_one_line(
    new_page: NewPage,
) -> None:
    async with running_server(KeepingEngine(in_turn(words(5)))) as url:
        dashboard = await new_page()  # the usual desktop width
        await dashboard.goto(http_base(url) + "/dashboard")
        await expect(dashboard.locator("#conn")).to_have_attribute("data-state", "connected")
        header = dashboard.get_by_role("columnheader", name="Session tokens")
        await expect(header).to_be_visible()
        kv = dashboard.locator("#t-kv")
        await expect(kv).to_contain_text("1,234,567 tokens")
        await expect(kv).to_contain_text("3.5 of 8.0 GiB")
        for element in (header, kv, dashboard.get_by_text("KV cache (idle sessions)")):
            assert await lines(element) == 1, await element.text_content()


@pytest.mark.parametrize("width", [PHONE["width"], 320])
async def test_dashboard_fits_a_phone_screen(new_page: NewPage, width: int) -> None:
    engine = KeepingEngine(in_turn(words(5)))
    engine.info = dataclasses.replace(engine.info, model=EMBEDDED_NAME)
    async with running_server(engine) as url:
        dashboard = await new_page(viewport={**PHONE, "width": width}, is_mobile=True)
        await dashboard.goto(http_base(url) + "/dashboard")
        await expect(dashboard.locator("#t-kv")).to_contain_text("1,234,567 tokens")
        # the model's name whole (it was cut to one letter at 390 px)
        model = dashboard.locator("#model")
        await expect(model).to_have_text(EMBEDDED_NAME)
        assert await shown_whole(model, width)
        wide = await dashboard.evaluate(
            """(w) => [...document.querySelectorAll('body *')]
                 .filter((e) => e.getBoundingClientRect().right > w + 0.5)
                 .map((e) => e.tagName + '#' + e.id + '.' + e.className).slice(0, 8)""",
            width,
        )
        assert await page_width(dashboard) <= width, wide
        assert await shown_whole(dashboard.get_by_role("link", name="Metrics"), width)
        await expect(dashboard.locator("#t-rewinds")).to_have_text("0 / 0")
        assert await shown_whole(dashboard.get_by_text("Rewinds / regens"), width)


async def test_dashboard_counts_rewinds_and_regenerates(new_page: NewPage) -> None:
    async with running_server(ScriptedEngine(in_turn(words(3)))) as url:
        dashboard = await new_page()
        await dashboard.goto(http_base(url) + "/dashboard")
        tile = dashboard.locator("#t-rewinds")
        await expect(tile).to_have_text("0 / 0")
        async with raw_peer(url) as (peer, _):
            for id in ("p1", "p2"):
                await peer.send({"type": "prompt", "id": id, "text": "hi"})
                await peer.recv_until("done")
            await peer.send({"type": "rewind", "keep": 1})
            await peer.recv_until("rewound")
            await peer.send({"type": "regenerate", "id": "r1"})
            await peer.recv_until("done")
            await expect(tile).to_have_text("1 / 1")


async def test_metrics_counters_move_after_a_generation(new_page: NewPage) -> None:
    engine = ScriptedEngine(in_turn(words(8, delay_s=0.01)))
    async with (
        running_server(engine) as url,
        httpx.AsyncClient(base_url=http_base(url), timeout=TIMEOUT) as http,
    ):
        before = samples((await http.get("/metrics")).text)
        chat = await ChatPage(await new_page(), http_base(url)).open()
        reply = await chat.send("count me")
        assert await chat.finished(reply) == "stop"
        response = await http.get("/metrics")
        assert response.headers["content-type"].startswith("text/plain")
        after = samples(response.text)
    assert after["wschat_generation_tokens_total"] - before["wschat_generation_tokens_total"] == 8
    assert after["wschat_prompt_tokens_total"] > before["wschat_prompt_tokens_total"]
    assert after["wschat_time_to_first_token_seconds_count"] == 1
    assert after["wschat_request_queue_seconds_count"] == 1
    # one gap after each token but the first, however the frames were merged
    assert after["wschat_inter_token_latency_seconds_count"] == 7
    assert after["wschat_sessions_active"] == 1
    assert after["wschat_model_info{device=cpu,dtype=none,model=scripted}"] == 1


async def test_a_dashboard_opened_after_a_reply_charts_the_seconds_before_it(
    new_page: NewPage,
) -> None:
    engine = ScriptedEngine(in_turn(words(30, delay_s=0.1)))
    async with running_server(engine) as url:
        async with raw_peer(url) as (peer, _):  # about 3 s of tokens, sampled each second
            await peer.send({"type": "prompt", "id": "a", "text": "hi"})
            await peer.recv_until("done")
        dashboard = await new_page()
        await dashboard.goto(http_base(url) + "/dashboard")
        body = dashboard.locator("body")
        await expect(body).to_have_attribute("data-history", re.compile(r"^[1-9]\d*$"))
        history = int(await body.get_attribute("data-history") or 0)
        charted = await dashboard.locator("#c-tokens").get_attribute("data-samples")
    assert history >= 2
    assert int(charted or 0) >= history + 1  # the samples before, then the frames since
