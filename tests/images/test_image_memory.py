"""What a session keeps of its images, with the tiny vision model (a 64x64 input): each image at
the processor's input size as soon as it is checked, whatever its upload's size, staged and in
the conversation; all of them under a per-session byte budget; and the model reads the same
pixels from that form as from the upload itself, so replies do not change. And what one check
holds on its way there: a large upload is decoded toward the kept size (a JPEG at a fraction of
its scale, others reduced at once), reading as the full decode does, within the bytes per pixel
the README states."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image as PILImage
from wschat.protocol import ErrorCode, GenerationParams, Image, Prompt, ProtocolError
from wschat.server.engine.base import GenerationRequest, SamplingParams
from wschat.server.engine.history import Conversation
from wschat.server.engine.local.hf import HFEngine
from wschat.server.engine.openai.vision import IMAGE_SIZE, normalise
from wschat.server.sessions.images import PEAK_BYTES_PER_PIXEL, ImageLimits, check_image
from wschat.server.sessions.session import Session
from wschat.server.sessions.snapshot import export_state

from tests.images import samples
from tests.sessions.test_session import done_of, image_bytes_of, make_session
from tests.support import TIMEOUT, RawPeer, collect, raw_peer, running_server

INPUT_BYTES = 64 * 64 * 3  # one image at the tiny processor's input size, RGB
LIMITS = ImageLimits(max_bytes=10_000_000, max_pixels=25_000_000)
UPLOADS = {  # small files that decode to large bitmaps, and one smaller than the input
    "1600x1200 png": samples.png(1600, 1200),
    "900x700 jpeg": samples.jpeg(900, 700),
    "30x2000 png": samples.png(30, 2000, samples.BLUE),
    "48x32 png": samples.png(),
}


def held_bytes(session: Session) -> list[int]:
    """Decoded bytes of every image the session holds: staged, and in its conversation."""
    staged = [image["image"] for image in export_state(session)["staged"]]
    return [np.asarray(image).nbytes for image in [*session.chat.images, *staged]]


async def test_a_session_keeps_each_image_at_the_models_input_size(
    tiny_vision_engine: HFEngine,
) -> None:
    session, recorder = make_session(tiny_vision_engine)  # type: ignore[arg-type]
    await session.handle(Image("i1", UPLOADS["1600x1200 png"]))
    assert held_bytes(session) == [INPUT_BYTES]
    uploads = (UPLOADS["900x700 jpeg"], UPLOADS["30x2000 png"])
    await session.handle(Prompt("a", "Look", uploads, GenerationParams(max_new_tokens=3)))
    await done_of(recorder, "a")
    assert held_bytes(session) == [INPUT_BYTES] * 3
    await session.handle(Image("i2", UPLOADS["48x32 png"]))
    await session.handle(Prompt("b", "And this?", (), GenerationParams(max_new_tokens=3)))
    await done_of(recorder, "b")
    assert held_bytes(session) == [INPUT_BYTES] * 4
    assert image_bytes_of(session) == 4 * INPUT_BYTES


@pytest.mark.parametrize("upload", UPLOADS.values(), ids=UPLOADS.keys())
def test_the_kept_form_gives_the_processor_the_pixels_of_the_upload(
    tiny_vision_engine: HFEngine, upload: bytes
) -> None:
    decoded = check_image(upload, LIMITS).image
    processor = tiny_vision_engine.loaded.processor.image_processor
    kept = tiny_vision_engine.prepare_image(decoded)
    from_upload = processor([decoded], return_tensors="pt")["pixel_values"]
    from_kept = processor([kept], return_tensors="pt")["pixel_values"]
    assert torch.equal(from_kept, from_upload)


async def test_a_reply_from_the_kept_form_is_the_reply_from_the_upload(
    tiny_vision_engine: HFEngine,
) -> None:
    decoded = check_image(UPLOADS["900x700 jpeg"], LIMITS).image
    ids = Conversation(tiny_vision_engine.prompt_format).prompt_ids(
        tiny_vision_engine.tokenize_text("Describe it."),
        [tiny_vision_engine.image_placeholder_ids()],
    )
    replies = []
    for image in (decoded, tiny_vision_engine.prepare_image(decoded)):
        request = GenerationRequest(ids, SamplingParams(max_new_tokens=12), [image])
        replies.append((await collect(tiny_vision_engine.generate(request)))[1].completion_ids)
    assert replies[0] == replies[1] and len(replies[0]) == 12


async def send_image(peer: RawPeer, image_id: str, data: bytes) -> dict[str, Any]:
    await peer.send({"type": "image", "id": image_id, "data": data})
    return await peer.recv()


async def test_images_over_the_session_budget_are_too_large_and_the_session_goes_on(
    tiny_vision_engine: HFEngine,
) -> None:
    budget = 3 * INPUT_BYTES
    async with (
        running_server(tiny_vision_engine, max_session_image_bytes=budget) as url,
        raw_peer(url) as (peer, _),
    ):
        two = [UPLOADS["48x32 png"], UPLOADS["900x700 jpeg"]]
        params = {"max_new_tokens": 2}
        await peer.send(
            {"type": "prompt", "id": "a", "text": "Hi", "images": two, "params": params}
        )
        assert (await peer.recv_until("done"))[-1]["reason"] == "length"
        assert (await send_image(peer, "i1", UPLOADS["48x32 png"]))["type"] == "image_ok"
        refused = await send_image(peer, "i2", UPLOADS["1600x1200 png"])
        assert refused == {
            "type": "error",
            "id": "i2",
            "code": "too_large",
            "message": f"this session's images would hold {4 * INPUT_BYTES} bytes; "
            f"max_session_image_bytes is {budget} (reset to start afresh)",
        }
        await peer.send({"type": "prompt", "id": "b", "text": "Hi", "params": params})
        assert (await peer.recv_until("done"))[-1]["reason"] == "length"
        images = [UPLOADS["48x32 png"]]
        await peer.send({"type": "prompt", "id": "c", "text": "Hi", "images": images})
        error = await peer.recv()
        assert (error["id"], error["code"]) == ("c", "too_large")
        await peer.send({"type": "reset", "id": "r"})
        assert (await peer.recv())["type"] == "reset_ok"
        assert (await send_image(peer, "i3", UPLOADS["1600x1200 png"]))["type"] == "image_ok"


async def test_a_refused_image_leaves_what_the_session_holds_unchanged(
    tiny_vision_engine: HFEngine,
) -> None:
    session, _ = make_session(tiny_vision_engine, max_session_image_bytes=INPUT_BYTES)  # type: ignore[arg-type]
    await session.handle(Image("i1", UPLOADS["48x32 png"]))
    with pytest.raises(ProtocolError) as refused:
        await session.handle(Image("i2", UPLOADS["48x32 png"]))
    assert (refused.value.code, refused.value.id) == (ErrorCode.TOO_LARGE, "i2")
    assert held_bytes(session) == [INPUT_BYTES]


def test_an_image_is_kept_as_uint8_rgb_at_the_input_size(tiny_vision_engine: HFEngine) -> None:
    kept = tiny_vision_engine.prepare_image(PILImage.new("RGB", (640, 480), samples.GREEN))
    assert kept.shape == (64, 64, 3) and kept.dtype == np.uint8
    assert (kept == samples.GREEN).all()


GEMMA = (IMAGE_SIZE, IMAGE_SIZE)  # what the OpenAI engine's prepare_image (normalise) makes
LARGE = {  # reduced by 2 on each side on their way to 896
    "3600x2700 jpeg": samples.encoded(samples.photo(3600, 2700), "JPEG", quality=90),
    "3600x2700 png with alpha": samples.encoded(samples.photo(3600, 2700, alpha=True), "PNG"),
}


@pytest.mark.parametrize("upload", LARGE.values(), ids=LARGE.keys())
def test_a_large_upload_decoded_toward_the_kept_size_reads_as_the_full_decode(
    upload: bytes,
) -> None:
    limits = ImageLimits(len(upload), 25_000_000)
    toward = check_image(upload, limits, normalise, GEMMA)
    full = check_image(upload, limits)
    assert (toward.width, toward.height, toward.image.size) == (3600, 2700, GEMMA)
    difference = np.abs(
        np.asarray(toward.image, np.int16) - np.asarray(normalise(full.image), np.int16)
    )
    assert difference.mean() < 0.5 and np.percentile(difference, 99) <= 3  # of 255


# One check in a process of its own: how far its peak RSS (VmHWM, set back to the RSS first:
# ru_maxrss would count what the parent held before exec) rises per pixel of the upload.
PEAK_OF_ONE_CHECK = """
import sys
from pathlib import Path
from wschat.server.engine.openai.vision import IMAGE_SIZE, normalise
from wschat.server.sessions.images import ImageLimits, check_image
def peak():
    status = Path("/proc/self/status").read_text().split("VmHWM:")[1]
    return int(status.split()[0]) * 1024
data, warm_up = Path(sys.argv[1]).read_bytes(), Path(sys.argv[2]).read_bytes()
check_image(warm_up, ImageLimits(len(warm_up), 100), normalise, (IMAGE_SIZE,) * 2)
Path("/proc/self/clear_refs").write_text("5")
before = peak()
checked = check_image(data, ImageLimits(len(data), 25_000_000), normalise, (IMAGE_SIZE,) * 2)
print((peak() - before) / (checked.width * checked.height))
"""
SIDE = 4000  # 16 million pixels: their bitmap dwarfs everything else the process holds
HALF_CLEAR = (10, 20, 30, 128)
# mode, color, format, options: each file a few KB, all the cost in decoding it
HUGE: dict[str, tuple[str, int | tuple[int, ...], str, dict[str, Any]]] = {
    "webp with alpha": ("RGBA", HALF_CLEAR, "WEBP", {"lossless": True}),
    "png with alpha": ("RGBA", HALF_CLEAR, "PNG", {}),
    "gif with a clear color": ("P", 3, "GIF", {"transparency": 3}),
    "jpeg": ("RGB", HALF_CLEAR[:3], "JPEG", {}),
}


def bytes_per_pixel_of_one_check(path: Path, warm_up: Path) -> float:
    """The peak a check of ``path`` adds, per pixel of it (``warm_up``, a small image checked
    first, loads what every check loads)."""
    done = subprocess.run(
        [sys.executable, "-c", PEAK_OF_ONE_CHECK, str(path), str(warm_up)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT * 4,
    )
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


@pytest.mark.parametrize("name", HUGE.keys())
def test_one_check_holds_at_most_the_stated_bytes_per_pixel(name: str, tmp_path: Path) -> None:
    mode, color, fmt, options = HUGE[name]
    path, warm_up = tmp_path / "upload", tmp_path / "warm_up"
    path.write_bytes(samples.encoded(PILImage.new(mode, (SIDE, SIDE), color), fmt, **options))
    warm_up.write_bytes(samples.encoded(PILImage.new(mode, (8, 8), color), fmt, **options))
    per_pixel = bytes_per_pixel_of_one_check(path, warm_up)
    print(f"{name}: one check of {SIDE}x{SIDE} peaks at {per_pixel:.1f} bytes a pixel")
    assert per_pixel <= PEAK_BYTES_PER_PIXEL
    if fmt == "JPEG":  # decoded at a quarter of its scale: never a bitmap of its full size
        assert per_pixel < 4
