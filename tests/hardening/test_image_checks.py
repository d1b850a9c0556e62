"""Uploaded images are decoded and checked a few at a time, server-wide (``--max-image-checks``,
sessions/gates.py): requests with many images from the HTTP API and the WebSocket at once wait
their turn (none is refused), so a burst of them costs at most that many decoded bitmaps and
that many busy cores, not one per request (README "Security and limits")."""

from __future__ import annotations

import asyncio
import base64
import threading
from typing import Any

import httpx
from openai.types.chat import ChatCompletion

from tests.api.support import async_client
from tests.fakes.scripted import ScriptedEngine
from tests.images import samples
from tests.prometheus import samples as metric_samples
from tests.support import TIMEOUT, http_base, raw_peer, running_server, wait_until

MAX_IMAGE_CHECKS = 2
API_REQUESTS, WEBSOCKET_PROMPTS, IMAGES_EACH = 6, 2, 4


class ProbedChecks(ScriptedEngine):
    """A model that reads images and counts the checks under way at once, from inside each: its
    ``prepare_image`` (a check's last step, in the check's worker thread) holds every check
    until the test lets them go."""

    def __init__(self) -> None:
        super().__init__(images=True, max_images=IMAGES_EACH)
        self._lock = threading.Lock()  # guards inside and most (the checks' threads)
        self.inside = 0
        self.most = 0
        self.go = threading.Event()  # set by the test: the held checks end

    def prepare_image(self, image: object) -> object:
        with self._lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        try:
            self.go.wait(TIMEOUT)
        finally:
            with self._lock:
                self.inside -= 1
        return super().prepare_image(image)


def images_message(images: list[bytes]) -> Any:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "What are these?"}]
    for data in images:
        url = "data:image/png;base64," + base64.b64encode(data).decode()
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return {"role": "user", "content": parts}


async def checks_waiting(url: str) -> float:
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        text = (await http.get(f"{http_base(url)}/metrics")).text
    return metric_samples(text).get("wschat_image_checks_waiting", 0.0)


async def websocket_prompt(url: str, images: list[bytes]) -> dict[str, Any]:
    async with raw_peer(url) as (peer, _):
        frame = {"type": "prompt", "id": "p", "text": "And these?", "images": images}
        await peer.send({**frame, "params": {"max_new_tokens": 4}})
        return (await peer.recv_until("done"))[-1]


async def test_image_requests_at_once_are_checked_a_few_at_a_time_and_all_served() -> None:
    engine = ProbedChecks()
    images = [samples.png(40 + n, 30) for n in range(IMAGES_EACH)]
    requests = API_REQUESTS + WEBSOCKET_PROMPTS
    async with (
        running_server(engine, max_image_checks=MAX_IMAGE_CHECKS) as url,
        async_client(url) as client,
    ):
        api = [
            asyncio.create_task(
                client.chat.completions.create(
                    model="any", messages=[images_message(images)], max_tokens=4
                )
            )
            for _ in range(API_REQUESTS)
        ]
        websocket = [
            asyncio.create_task(websocket_prompt(url, images)) for _ in range(WEBSOCKET_PROMPTS)
        ]
        try:
            # every request has reached its first check: one at work or waiting for its turn
            async with asyncio.timeout(TIMEOUT):
                while engine.inside + await checks_waiting(url) < requests:
                    await asyncio.sleep(0.02)  # threads and another task: nothing to await
            at_work = engine.inside
        finally:
            engine.go.set()
        async with asyncio.timeout(TIMEOUT):
            replies: list[ChatCompletion] = await asyncio.gather(*api)
            dones = await asyncio.gather(*websocket)
        await wait_until(lambda: engine.inside == 0)
    assert at_work == MAX_IMAGE_CHECKS
    assert engine.most == MAX_IMAGE_CHECKS  # never more, in all 32 checks
    assert [r.choices[0].finish_reason for r in replies] == ["length"] * API_REQUESTS
    assert [d["reason"] for d in dones] == ["length"] * WEBSOCKET_PROMPTS
