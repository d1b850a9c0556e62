"""Bad images over a real server with the tiny vision model: each gets its documented error code
and the session goes on (PROTOCOL.md "Client frames", "Errors")."""

from __future__ import annotations

import random
from typing import Any

import pytest
from wschat.server.engine.local.hf import HFEngine
from wschat.server.engine.local.loader import LoadedModel
from wschat.server.engine.local.options import LocalEngineOptions

from tests.images import samples
from tests.support import RawPeer, raw_peer, running_server

_JPEG = samples.jpeg(400, 300)

BAD = [
    ("random bytes", random.Random(7).randbytes(2048), "bad_image"),
    ("empty bytes", b"", "bad_image"),
    ("truncated jpeg", _JPEG[: len(_JPEG) // 2], "bad_image"),
    ("20000x20000 png bomb", samples.png_bomb(), "too_large"),
    ("eps", samples.eps(), "bad_image"),
    ("tiff", samples.tiff(), "bad_image"),
]


async def goes_on(peer: RawPeer) -> None:
    """The session still answers and still generates."""
    await peer.send({"type": "ping", "t": "still there"})
    assert await peer.recv() == {"type": "pong", "t": "still there"}
    await short_prompt(peer, "after")


async def short_prompt(peer: RawPeer, frame_id: str) -> dict[str, Any]:
    """A 2-token reply; its ``done``."""
    params = {"max_new_tokens": 2}
    await peer.send({"type": "prompt", "id": frame_id, "text": "Hi", "params": params})
    done = (await peer.recv_until("done"))[-1]
    assert done["reason"] == "length"
    return done


@pytest.mark.parametrize(("data", "code"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
async def test_bad_image_frame_gets_its_error_and_the_session_goes_on(
    tiny_vision_engine: HFEngine, data: bytes, code: str
) -> None:
    async with running_server(tiny_vision_engine) as url, raw_peer(url) as (peer, _):
        await peer.send({"type": "image", "id": "i1", "data": data, "mime": "image/png"})
        error = await peer.recv()
        assert (error["type"], error["id"], error["code"]) == ("error", "i1", code)
        await goes_on(peer)


@pytest.mark.parametrize(("data", "code"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
async def test_bad_image_in_a_prompt_gets_its_error_and_nothing_starts(
    tiny_vision_engine: HFEngine, data: bytes, code: str
) -> None:
    async with running_server(tiny_vision_engine) as url, raw_peer(url) as (peer, _):
        await peer.send({"type": "prompt", "id": "p1", "text": "see", "images": [data]})
        error = await peer.recv()
        assert (error["type"], error["id"], error["code"]) == ("error", "p1", code)
        await goes_on(peer)


async def test_bomb_refusal_names_the_pixel_limit(tiny_vision_engine: HFEngine) -> None:
    async with running_server(tiny_vision_engine) as url, raw_peer(url) as (peer, ready):
        await peer.send({"type": "image", "id": "i1", "data": samples.png_bomb()})
        error = await peer.recv()
    assert "max_image_pixels" in error["message"]
    assert ready["limits"]["max_image_pixels"] == 25_000_000


async def test_image_over_max_image_bytes_is_too_large(tiny_vision_engine: HFEngine) -> None:
    server = running_server(tiny_vision_engine, max_image_bytes=len(_JPEG) - 1)
    async with server as url, raw_peer(url) as (peer, _):
        await peer.send({"type": "image", "id": "i1", "data": _JPEG})
        error = await peer.recv()
        assert error["code"] == "too_large"
        assert str(len(_JPEG) - 1) in error["message"]  # the codec refuses it, naming the limit
        await goes_on(peer)


@pytest.mark.parametrize(
    ("data", "size"),
    [(samples.animated_gif(30, 20), (30, 20)), (samples.rotated_jpeg(40, 20), (20, 40))],
    ids=["animated gif: first frame", "exif-rotated jpeg: upright size"],
)
async def test_accepted_images_report_the_size_the_model_sees(
    tiny_vision_engine: HFEngine, data: bytes, size: tuple[int, int]
) -> None:
    async with running_server(tiny_vision_engine) as url, raw_peer(url) as (peer, _):
        await peer.send({"type": "image", "id": "i1", "data": data})
        ok = await peer.recv()
        assert ok == {"type": "image_ok", "id": "i1", "width": size[0], "height": size[1]}
        await short_prompt(peer, "p")


async def test_more_images_than_max_images_is_too_large(tiny_vision_loaded: LoadedModel) -> None:
    engine = HFEngine(tiny_vision_loaded, LocalEngineOptions(max_images=2))
    picture = samples.png()
    async with running_server(engine) as url, raw_peer(url) as (peer, ready):
        assert ready["capabilities"] == {"images": True, "max_images": 2}
        frames: list[dict[str, Any]] = []
        for i in range(3):
            await peer.send({"type": "image", "id": f"i{i}", "data": picture})
            frames.append(await peer.recv())
        assert [f["type"] for f in frames] == ["image_ok", "image_ok", "error"]
        assert frames[2]["code"] == "too_large" and "at most 2 images" in frames[2]["message"]
        # Two staged plus one in the prompt is three: refused, and the stage is kept.
        await peer.send({"type": "prompt", "id": "p1", "text": "x", "images": [picture]})
        error = await peer.recv()
        assert (error["code"], error["id"]) == ("too_large", "p1")
        done = await short_prompt(peer, "p2")
        per_image = len(engine.image_placeholder_ids())
        assert done["usage"]["prompt_tokens"] > 2 * per_image


async def test_text_only_model_refuses_images_with_unsupported(tiny_text_engine: HFEngine) -> None:
    async with running_server(tiny_text_engine) as url, raw_peer(url) as (peer, ready):
        assert ready["capabilities"] == {"images": False, "max_images": 0}
        await peer.send({"type": "image", "id": "i1", "data": samples.png()})
        staged = await peer.recv()
        await peer.send({"type": "prompt", "id": "p1", "text": "see", "images": [samples.png()]})
        inline = await peer.recv()
        for error, frame_id in ((staged, "i1"), (inline, "p1")):
            assert (error["type"], error["id"], error["code"]) == ("error", frame_id, "unsupported")
        await goes_on(peer)
