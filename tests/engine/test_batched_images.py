"""``BatchedEngine`` with images, on the tiny random Gemma 3 with a vision tower: turns with new
images run in ``generate``, the text-only turns after them come back to the batch on its KV
state, and a text turn whose image state was evicted is re-encoded."""

from __future__ import annotations

from typing import Any

from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.hf import HFEngine
from wschat.server.engine.local.loader import LoadedModel
from wschat.server.engine.local.options import LocalEngineOptions

from tests.engine.local_turns import ask
from tests.images import samples
from tests.support import raw_peer, running_server


async def test_an_image_conversations_text_only_turns_run_in_the_batch_and_equal_generate(
    tiny_vision_loaded: LoadedModel,
) -> None:
    """Turns with new images run in generate; the turns after them without images come back to
    the batch on generate's KV state (image tokens included), and every reply equals that of an
    engine that re-encodes every image and prefills everything each turn."""
    engine = BatchedEngine(tiny_vision_loaded, LocalEngineOptions(prefill_tokens=32))
    twin = HFEngine(tiny_vision_loaded, LocalEngineOptions(kv_budget_bytes=0))
    turns = [
        ("What is this?", [samples.png()]),
        ("And now? " * 6, None),  # a tail longer than the sliding window (16)
        ("Once more.", None),
        ("Compare it with this one.", [samples.jpeg(32, 32)]),
        ("Which one is larger?", None),
    ]
    replies: dict[str, list[list[dict[str, Any]]]] = {"batched": [], "twin": []}
    paths: list[dict[str, int]] = []
    try:
        for name, each in (("batched", engine), ("twin", twin)):
            async with running_server(each) as url, raw_peer(url) as (peer, ready):
                assert ready["capabilities"] == {"images": True, "max_images": 4}
                for n, (text, images) in enumerate(turns):
                    frame: dict[str, Any] = {
                        "type": "prompt",
                        "id": str(n),
                        "text": text,
                        "params": {"max_new_tokens": 6},
                    }
                    if images:
                        frame["images"] = images
                    await peer.send(frame)
                    replies[name].append(await peer.recv_until("done"))
                    paths.append(dict(engine.image_turns))
    finally:
        await engine.aclose()
        await twin.aclose()
    assert [r[-1]["text"] for r in replies["batched"]] == [r[-1]["text"] for r in replies["twin"]]
    assert all(r[-1]["reason"] == "length" for r in replies["batched"])
    assert paths[:5] == [
        {"generate": 1, "batch": 0},
        {"generate": 1, "batch": 1},
        {"generate": 1, "batch": 2},
        {"generate": 2, "batch": 2},
        {"generate": 2, "batch": 3},
    ]
    assert engine.decode_steps > 0
    cached = [r[0]["cached_tokens"] for r in replies["batched"]]
    assert cached[0] == 0 and all(c > 0 for c in cached[1:3] + cached[4:])


async def test_a_text_turn_whose_image_state_was_evicted_re_encodes_in_generate(
    tiny_vision_loaded: LoadedModel,
) -> None:
    # keeps nothing
    engine = BatchedEngine(tiny_vision_loaded, LocalEngineOptions(kv_budget_bytes=0))
    try:
        async with running_server(engine) as url, raw_peer(url) as (peer, _):
            frame = {
                "type": "prompt",
                "id": "a",
                "text": "What is this?",
                "images": [samples.png()],
                "params": {"max_new_tokens": 5},
            }
            await peer.send(frame)
            with_image = await peer.recv_until("done")
            text_only = await ask(peer, "b", "And now?", max_new_tokens=5)
    finally:
        await engine.aclose()
    assert with_image[0]["prompt_tokens"] > len(engine.image_placeholder_ids())
    assert engine.image_turns == {"generate": 2, "batch": 0}
    assert engine.decode_steps == 0
    assert text_only[0]["cached_tokens"] == 0 and text_only[-1]["reason"] == "length"
