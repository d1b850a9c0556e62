"""``check_image``: the rules of server/sessions/images.py, one test each, and hostile inputs."""

from __future__ import annotations

import io
import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageFile
from wschat.protocol import ErrorCode, ProtocolError
from wschat.server.sessions.images import CheckedImage, ImageLimits, check_image

from tests.images import samples

LIMITS = ImageLimits(max_bytes=1_000_000, max_pixels=4_000_000)


def refusal(data: bytes, limits: ImageLimits = LIMITS) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        check_image(data, limits)
    return caught.value


@pytest.mark.parametrize(
    ("data", "fmt"),
    [
        (samples.png(), "PNG"),
        (samples.jpeg(), "JPEG"),
        (samples.encoded(samples.noise(48, 32), "WEBP"), "WEBP"),
        (samples.encoded(Image.new("RGB", (48, 32), samples.RED), "GIF"), "GIF"),
    ],
)
def test_allowed_formats_decode_to_rgb_with_their_size(data: bytes, fmt: str) -> None:
    checked = check_image(data, LIMITS)
    assert (checked.width, checked.height, checked.format) == (48, 32, fmt)
    assert checked.image.mode == "RGB" and checked.image.size == (48, 32)


@pytest.mark.parametrize("data", [samples.tiff(), samples.eps()], ids=["tiff", "eps"])
def test_formats_pillow_knows_but_we_do_not_allow_are_bad_image(data: bytes) -> None:
    assert Image.open(io.BytesIO(data)).format in {"TIFF", "EPS"}  # Pillow would open them
    error = refusal(data)
    assert error.code is ErrorCode.BAD_IMAGE
    assert error.message == "the image is not a PNG, JPEG, WebP or GIF"


def test_random_bytes_are_bad_image() -> None:
    error = refusal(random.Random(1).randbytes(4096))
    assert error.code is ErrorCode.BAD_IMAGE


def test_empty_bytes_are_bad_image() -> None:
    error = refusal(b"")
    assert (error.code, error.message) == (ErrorCode.BAD_IMAGE, "the image is empty")


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated_file_is_bad_image(fmt: str) -> None:
    whole = samples.encoded(samples.noise(400, 300), fmt)
    error = refusal(whole[: len(whole) // 2])
    assert error.code is ErrorCode.BAD_IMAGE
    assert error.message == f"the {fmt} image does not decode (truncated or corrupt)"
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_truncated_jpeg_that_verify_passes_is_refused_by_the_full_decode() -> None:
    whole = samples.jpeg(400, 300)
    cut = whole[: len(whole) // 2]
    Image.open(io.BytesIO(cut)).verify()  # a verify()-only check would accept this file
    assert refusal(cut).code is ErrorCode.BAD_IMAGE


def test_over_max_bytes_is_too_large_naming_the_limit() -> None:
    data = samples.jpeg(400, 300)
    error = refusal(data, ImageLimits(max_bytes=len(data) - 1, max_pixels=LIMITS.max_pixels))
    assert error.code is ErrorCode.TOO_LARGE
    assert error.message == f"the image is {len(data)} bytes; max_image_bytes is {len(data) - 1}"


def test_png_bomb_is_too_large_before_decoding() -> None:
    bomb = samples.png_bomb()  # 20000 x 20000: 400M pixels in under 100 KB
    assert len(bomb) < 100_000
    error = refusal(bomb, ImageLimits(max_bytes=10_000_000, max_pixels=25_000_000))
    assert error.code is ErrorCode.TOO_LARGE
    assert "max_image_pixels" in error.message


def test_pillow_warning_zone_is_refused_even_when_our_limit_is_higher() -> None:
    # 100M pixels: Pillow only warns (its limit is 89M, errors from 179M).
    width, height = 10_000, 10_000
    assert Image.MAX_IMAGE_PIXELS is not None
    assert Image.MAX_IMAGE_PIXELS < width * height < 2 * Image.MAX_IMAGE_PIXELS
    with pytest.warns(Image.DecompressionBombWarning):
        error = refusal(samples.png_bomb(width, height), ImageLimits(10_000_000, 500_000_000))
    assert error.code is ErrorCode.TOO_LARGE
    assert error.message == (
        f"the image is 10000x10000 = 100000000 pixels; max_image_pixels is {Image.MAX_IMAGE_PIXELS}"
    )


@pytest.mark.filterwarnings("error::PIL.Image.DecompressionBombWarning")
def test_pillow_warning_zone_is_too_large_where_warnings_are_errors() -> None:
    # 100M pixels: the warning Pillow's open() gives is raised there (the suite's
    # ``filterwarnings = error``, ``python -W error``); it is our refusal all the same
    error = refusal(samples.png_bomb(10_000, 10_000))
    assert error.code is ErrorCode.TOO_LARGE
    assert error.message == f"the image is over max_image_pixels ({LIMITS.max_pixels})"


def test_over_max_pixels_is_too_large_naming_the_limit() -> None:
    error = refusal(samples.png(100, 50), ImageLimits(max_bytes=1_000_000, max_pixels=4_999))
    assert error.code is ErrorCode.TOO_LARGE
    assert error.message == "the image is 100x50 = 5000 pixels; max_image_pixels is 4999"


def test_exactly_max_pixels_is_accepted() -> None:
    assert check_image(samples.png(100, 50), ImageLimits(1_000_000, 5_000)).width == 100


def test_animated_gif_keeps_its_first_frame() -> None:
    checked = check_image(samples.animated_gif(30, 20), LIMITS)
    assert (checked.width, checked.height, checked.format) == (30, 20, "GIF")
    assert checked.image.getpixel((5, 5)) == samples.RED  # frames 2 and 3 are green, blue


def test_exif_orientation_is_applied_and_size_is_upright() -> None:
    checked = check_image(samples.rotated_jpeg(40, 20), LIMITS)
    assert (checked.width, checked.height) == (20, 40)
    assert checked.image.size == (20, 40)


def test_transparent_pixels_become_white() -> None:
    clear = samples.encoded(Image.new("RGBA", (8, 8), (0, 0, 0, 0)), "PNG")
    assert check_image(clear, LIMITS).image.getpixel((0, 0)) == (255, 255, 255)


def test_checks_run_concurrently_in_threads() -> None:
    data = [samples.jpeg(64, 48), samples.png_bomb(), samples.animated_gif()]
    results: list[CheckedImage | str] = []
    lock = threading.Lock()

    def check(blob: bytes) -> None:
        try:
            outcome: CheckedImage | str = check_image(blob, LIMITS)
        except ProtocolError as e:
            outcome = e.code.value
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=check, args=(d,)) for d in data * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 12
    assert sum(r == "too_large" for r in results) == 4
    assert sum(isinstance(r, CheckedImage) for r in results) == 8


_VALID = [samples.png(), samples.jpeg(), samples.animated_gif(), samples.rotated_jpeg()]


# A mutated EXIF block makes Pillow warn ("Corrupt EXIF data", or its TIFF reader's "Tag data
# larger than file", ...) and read no orientation: the image is still checked, upright as stored;
# the warnings are Pillow's, not a failure of ours.
@pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning")
@pytest.mark.filterwarnings("ignore:Possibly corrupt EXIF:UserWarning")
@pytest.mark.filterwarnings("ignore::UserWarning:PIL.TiffImagePlugin")
@settings(max_examples=150, deadline=None)
@given(
    which=st.sampled_from(range(len(_VALID))),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=8),
    cut=st.integers(1, 10_000),
)
def test_mutated_images_give_a_checked_image_or_our_error(
    which: int, edits: list[tuple[int, int]], cut: int
) -> None:
    data = bytearray(_VALID[which][:cut])
    for position, value in edits:
        data[position % len(data)] = value
    try:
        checked = check_image(bytes(data), LIMITS)
    except ProtocolError as e:
        assert e.code in {ErrorCode.BAD_IMAGE, ErrorCode.TOO_LARGE}
    else:
        assert checked.image.mode == "RGB"
        assert checked.width * checked.height <= LIMITS.max_pixels
