"""Checks an uploaded image before any model work (PROTOCOL.md "Client frames", ``image``).

Untrusted bytes go through Pillow in this order, each step refusing with a stable code:

    empty                                  bad_image
    over max_bytes                         too_large, before Pillow sees the bytes
    not PNG, JPEG, WebP or GIF             bad_image, whatever the bytes claim to be
    width x height over max_pixels         too_large, from the header, before decoding
    full decode fails                      bad_image (``verify()`` alone passes truncated files)

then EXIF orientation is applied (the reported size is the upright one) and the image becomes
RGB. GIF and other animations keep their first frame. Last, ``fit`` turns it into the form the
session keeps (the engine's ``prepare_image``: the model's input size), so the decoded bitmap,
up to max_image_pixels x 4 bytes, lives only while this runs. Runs in a worker thread
(session.py).
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError
from wschat.protocol import BadImage, TooLarge

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
# What Pillow's decoders raise on hostile or damaged input (its fuzzers expect the same set).
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, struct.error)
_WHITE = (255, 255, 255, 255)


@dataclass(frozen=True, slots=True)
class ImageLimits:
    max_bytes: int
    max_pixels: int


@dataclass(frozen=True, slots=True)
class CheckedImage:
    image: Any  # what ``fit`` made of it; without one, the decoded upright RGB image
    width: int  # of the upload, upright
    height: int
    format: str  # one of FORMATS


def image_bytes(image: Any) -> int:
    """The memory a kept image holds: an array's bytes; a Pillow image's pixels at 4 bytes each
    (how Pillow stores RGB)."""
    if isinstance(image, Image.Image):
        return image.width * image.height * 4
    return int(image.nbytes)


def check_image(
    data: bytes, limits: ImageLimits, fit: Callable[[Image.Image], Any] | None = None
) -> CheckedImage:
    """The image as ``fit`` makes it (or decoded), or ``BadImage`` / ``TooLarge`` naming
    the rule."""
    if not data:
        raise BadImage("the image is empty")
    if len(data) > limits.max_bytes:
        raise TooLarge(f"the image is {len(data)} bytes; max_image_bytes is {limits.max_bytes}")
    if ImageFile.LOAD_TRUNCATED_IMAGES:  # it would pad a truncated file with grey and accept it
        raise RuntimeError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES must stay False")
    im = _open(data, limits)
    try:
        _check_pixels(im.size, limits)
        try:
            im.load()  # the first frame only: later frames of an animation are never decoded
            upright = ImageOps.exif_transpose(im)
        except _DECODE_ERRORS as e:
            raise BadImage(f"the {im.format} image does not decode (truncated or corrupt)") from e
        rgb = _to_rgb(upright)
        return CheckedImage(rgb if fit is None else fit(rgb), rgb.width, rgb.height, str(im.format))
    finally:
        im.close()


def _open(data: bytes, limits: ImageLimits) -> Image.Image:
    """Reads only the header; ``formats`` keeps every other Pillow plugin (EPS, TIFF...) out."""
    try:
        return Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError as e:
        # Over twice Pillow's own MAX_IMAGE_PIXELS: refused by open() itself, before decoding.
        raise TooLarge(f"the image is over max_image_pixels ({limits.max_pixels})") from e
    except Image.DecompressionBombWarning as e:
        # Over MAX_IMAGE_PIXELS open() warns; where the warnings filters make that an error
        # (``-W error``, the tests) it is the refusal _check_pixels would make of the size.
        raise TooLarge(f"the image is over max_image_pixels ({_pixel_limit(limits)})") from e
    except UnidentifiedImageError as e:
        raise BadImage("the image is not a PNG, JPEG, WebP or GIF") from e
    except _DECODE_ERRORS as e:
        raise BadImage("the image header does not decode") from e


def _check_pixels(size: tuple[int, int], limits: ImageLimits) -> None:
    """Pillow only warns between its MAX_IMAGE_PIXELS and twice that; this refuses there too.

    Capping at Pillow's own limit makes its DecompressionBombWarning always end in a refusal
    without a warnings filter (``catch_warnings`` swaps process-wide state: not thread-safe).
    """
    width, height = size
    limit = _pixel_limit(limits)
    if width * height > limit:
        raise TooLarge(
            f"the image is {width}x{height} = {width * height} pixels; max_image_pixels is {limit}"
        )


def _pixel_limit(limits: ImageLimits) -> int:
    return min(limits.max_pixels, Image.MAX_IMAGE_PIXELS or limits.max_pixels)


def _to_rgb(im: Image.Image) -> Image.Image:
    """Transparent areas become white (a screenshot's transparent margin is not black)."""
    if im.mode == "RGB":
        return im
    if "A" in im.getbands() or "transparency" in im.info:
        rgba = im.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, _WHITE), rgba).convert("RGB")
    return im.convert("RGB")
