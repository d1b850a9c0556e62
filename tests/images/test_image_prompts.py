"""Prompts with images through the real loader, processor and generate (the tiny vision model)
over a real server."""

from __future__ import annotations

from typing import Any

from wschat.server.engine.local.hf import HFEngine
from wschat.server.engine.local.loader import LoadedModel
from wschat.server.engine.local.options import LocalEngineOptions

from tests.images import samples
from tests.support import RawPeer, raw_peer, running_server

IMAGE_TOKEN = 262144  # <image_soft_token>
LONG = 400


async def ask(
    peer: RawPeer, frame_id: str, text: str, images: list[bytes] | None = None, **params: Any
) -> list[dict[str, Any]]:
    frame: dict[str, Any] = {"type": "prompt", "id": frame_id, "text": text, "params": params}
    if images is not None:
        frame["images"] = images
    await peer.send(frame)
    return await peer.recv_until("done")


def assert_streamed(frames: list[dict[str, Any]], reason: str = "length") -> None:
    assert frames[0]["type"] == "start"
    tokens = [f for f in frames if f["type"] == "token"]
    assert tokens, "no token frames"
    done = frames[-1]
    assert done["reason"] == reason
    assert "".join(t["text"] for t in tokens) == done["text"]


def test_placeholder_is_the_processors_expansion_of_one_image(
    tiny_vision_engine: HFEngine,
) -> None:
    placeholder = tiny_vision_engine.image_placeholder_ids()
    processor = tiny_vision_engine.loaded.processor
    assert processor is not None
    expanded = processor(text=[processor.boi_token], images=[[samples.noise(64, 64)]])
    assert expanded["input_ids"][0] == [2, *placeholder]  # <bos>, then the image's run
    assert placeholder.count(IMAGE_TOKEN) == 16
    assert placeholder[1:2] + placeholder[-2:-1] == [255999, 256000]  # boi ... eoi


async def test_prompts_with_one_and_two_images_stream_and_grow_by_the_image_tokens(
    tiny_vision_engine: HFEngine,
) -> None:
    per_image = len(tiny_vision_engine.image_placeholder_ids())
    pictures = [samples.png(), samples.jpeg(80, 60)]
    counts = []
    async with running_server(tiny_vision_engine) as url:
        for n in range(3):
            async with raw_peer(url) as (peer, ready):
                assert ready["capabilities"] == {"images": True, "max_images": 4}
                frames = await ask(peer, "a", "What is this?", pictures[:n], max_new_tokens=6)
            assert_streamed(frames)
            counts.append(frames[0]["prompt_tokens"])
            assert frames[-1]["usage"]["prompt_tokens"] == counts[-1]
    assert [c - counts[0] for c in counts] == [0, per_image, 2 * per_image]


async def test_follow_up_keeps_the_image_and_matches_a_full_reprefill(
    tiny_vision_loaded: LoadedModel,
) -> None:
    """The second and third turns reuse the KV state of the first (image included); a twin
    engine that keeps no KV state re-encodes every image and must reply the same."""
    reusing = HFEngine(tiny_vision_loaded)
    reprefilling = HFEngine(tiny_vision_loaded, LocalEngineOptions(kv_budget_bytes=0))
    turns = [
        ("Look at this.", [samples.jpeg(64, 64)]),
        ("What was in the picture above?", None),
        ("And compare it with this one.", [samples.png(32, 32, samples.BLUE)]),
    ]
    replies: dict[str, list[list[dict[str, Any]]]] = {}
    for name, engine in (("reusing", reusing), ("reprefilling", reprefilling)):
        async with running_server(engine) as url, raw_peer(url) as (peer, _):
            replies[name] = []
            for i, (text, images) in enumerate(turns):
                frames = await ask(peer, f"t{i}", text, images, max_new_tokens=8, temperature=0)
                assert_streamed(frames)
                replies[name].append(frames)
    for got, want in zip(replies["reusing"], replies["reprefilling"], strict=True):
        assert got[-1]["text"] == want[-1]["text"]
        assert got[0]["prompt_tokens"] == want[0]["prompt_tokens"]
        assert want[0]["cached_tokens"] == 0
    cached = [frames[0]["cached_tokens"] for frames in replies["reusing"]]
    assert cached[0] == 0
    assert cached[1] == replies["reusing"][0][0]["prompt_tokens"] + 8 - 1
    assert cached[2] == replies["reusing"][1][0]["prompt_tokens"] + 8 - 1


async def test_the_image_changes_the_reply(tiny_vision_engine: HFEngine) -> None:
    async with running_server(tiny_vision_engine) as url:
        texts = []
        for picture in (samples.png(color=samples.RED), samples.jpeg(64, 64)):
            async with raw_peer(url) as (peer, _):
                frames = await ask(peer, "a", "Describe it.", [picture], max_new_tokens=8)
            texts.append(frames[-1]["text"])
    assert texts[0] != texts[1]


async def test_cancel_mid_generation_with_an_image_sends_one_done(
    tiny_vision_engine: HFEngine,
) -> None:
    async with running_server(tiny_vision_engine) as url, raw_peer(url) as (peer, _):
        await peer.send(
            {
                "type": "prompt",
                "id": "a",
                "text": "Go on and on",
                "images": [samples.png()],
                "params": {"max_new_tokens": LONG},
            }
        )
        await peer.recv_until("token")
        await peer.send({"type": "cancel", "id": "a"})
        frames = await peer.recv_until("done")
        assert [f["type"] for f in frames].count("done") == 1
        assert frames[-1]["reason"] == "cancelled"
        assert frames[-1]["usage"]["completion_tokens"] < LONG
        assert_streamed(await ask(peer, "b", "Again?", max_new_tokens=3))


async def test_staged_image_frame_then_prompt_uses_the_image(tiny_vision_engine: HFEngine) -> None:
    per_image = len(tiny_vision_engine.image_placeholder_ids())
    async with running_server(tiny_vision_engine) as url:
        async with raw_peer(url) as (peer, _):
            plain = await ask(peer, "a", "Hello", max_new_tokens=3)
        async with raw_peer(url) as (peer, _):
            await peer.send({"type": "image", "id": "i1", "data": samples.png(48, 32)})
            assert await peer.recv() == {"type": "image_ok", "id": "i1", "width": 48, "height": 32}
            staged = await ask(peer, "a", "Hello", max_new_tokens=3)
            after = await ask(peer, "b", "Hello", max_new_tokens=3)  # the stage was emptied
    assert_streamed(staged)
    assert staged[0]["prompt_tokens"] == plain[0]["prompt_tokens"] + per_image
    assert after[0]["prompt_tokens"] - after[0]["cached_tokens"] < per_image


async def test_image_token_typed_as_text_is_not_an_image(tiny_vision_engine: HFEngine) -> None:
    typed = "<image_soft_token>" * 16
    assert IMAGE_TOKEN not in tiny_vision_engine.tokenize_text(typed)
    async with running_server(tiny_vision_engine) as url, raw_peer(url) as (peer, _):
        frames = await ask(peer, "a", typed, max_new_tokens=3)
    assert_streamed(frames)
