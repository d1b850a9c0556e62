"""Images from the client: paths, bytes and PIL images become ``bin`` data in frames."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image as PILImage
from wschat.client import FinishReason, TooLargeError, UnsupportedError, connect
from wschat.client.images import image_bytes, sniff_mime

from tests.client.engines import WAIT
from tests.fakes.scripted import ScriptedEngine
from tests.support import running_server


def png(width: int, height: int, mode: str = "RGB") -> bytes:
    buffer = io.BytesIO()
    PILImage.new(mode, (width, height), "red" if mode == "RGB" else 0).save(buffer, "PNG")
    return buffer.getvalue()


def decoded_size(data: bytes) -> tuple[int, int]:
    with PILImage.open(io.BytesIO(data)) as image:
        return image.size


def test_image_inputs_become_encoded_bytes_with_their_mime(tmp_path: Path) -> None:
    path = tmp_path / "photo.png"
    path.write_bytes(png(5, 2))
    assert image_bytes(path) == (path.read_bytes(), "image/png")
    assert image_bytes(str(path)) == (path.read_bytes(), "image/png")
    jpeg_start = b"\xff\xd8\xff\xe0rest"
    assert image_bytes(bytearray(jpeg_start)) == (jpeg_start, "image/jpeg")
    data, mime = image_bytes(PILImage.new("CMYK", (6, 1)))
    assert mime == "image/png" and decoded_size(data) == (6, 1)
    assert sniff_mime(b"RIFF\0\0\0\0WEBPVP8 ") == "image/webp"
    assert sniff_mime(b"%!PS-Adobe-3.0 EPSF") is None


def test_image_input_of_another_type_raises_type_error() -> None:
    with pytest.raises(TypeError, match="an image must be a path, bytes or a PIL image, not int"):
        image_bytes(42)


async def test_text_only_model_refuses_images_with_unsupported() -> None:
    async with running_server(ScriptedEngine()) as url, connect(url, timeout=WAIT) as chat:
        assert chat.capabilities.images is False
        with pytest.raises(UnsupportedError) as refused:
            await chat.prompt("what is this?", images=[png(4, 4)]).wait(WAIT)
        assert refused.value.message == "the model 'scripted' does not read images"
        with pytest.raises(UnsupportedError):
            await chat.image(png(4, 4))
        assert (await chat.prompt("just text").wait(WAIT)).reason is FinishReason.STOP


async def test_image_over_the_server_limit_is_refused_before_sending() -> None:
    engine = ScriptedEngine(images=True)
    async with (
        running_server(engine, max_image_bytes=1000) as url,
        connect(url, timeout=WAIT) as chat,
    ):
        big = png(64, 64) + b"\0" * 1000
        with pytest.raises(TooLargeError) as refused:
            chat.prompt("look", images=[big])
        assert refused.value.message == f"image of {len(big)} bytes is over the server's 1000"
        with pytest.raises(TooLargeError):
            await chat.image(big)
        await chat.ping()
        assert engine.requests == []


async def test_prompt_images_from_paths_bytes_and_pil_reach_the_model(tmp_path: Path) -> None:
    path = tmp_path / "one.png"
    path.write_bytes(png(4, 3))
    engine = ScriptedEngine(images=True)
    async with running_server(engine) as url, connect(url, timeout=WAIT) as chat:
        assert chat.capabilities.images is True
        text_only = await chat.prompt("plain").wait(WAIT)
        await chat.reset()
        staged = await chat.image(png(7, 5))
        assert (staged.width, staged.height) == (7, 5)
        reply = chat.prompt("compare", images=[path, png(5, 2), PILImage.new("L", (6, 1))])
        done = await reply.wait(WAIT)
        assert done.reason is FinishReason.STOP
        placeholder = len(engine.image_placeholder_ids())
        extra = len(engine.tokenize_text("compare")) - len(engine.tokenize_text("plain"))
        assert reply.start is not None
        assert reply.start.prompt_tokens == text_only.usage.prompt_tokens + extra + 4 * placeholder
        assert len(engine.requests[-1].images) == 4
