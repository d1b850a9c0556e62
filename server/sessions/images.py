"""Checks an uploaded image before any model work (PROTOCOL.md "Client frames", ``image``).

Untrusted bytes go through Pillow in this order, each step refusing with a stable code:

    empty                                  bad_image
    over max_bytes                         too_large, before Pillow sees the bytes
    not PNG, JPEG, WebP or GIF             bad_image, whatever the bytes claim to be
    width x height over max_pixels         too_large, from the header, before decoding
    full decode fails                      bad_image (``verify()`` alone passes truncated files)

then EXIF orientation is applied (the reported size is the upright one) and the image becomes
RGB, transparent areas white. GIF and other animations keep their first frame. Last, ``fit``
turns it into the form the session keeps (the engine's ``prepare_image``: the model's input
size). Runs in a worker thread, a few at once server-wide (``Gate``, hub.py).

``ImageRules`` holds a session's images to their limits, for every door alike (an ``image`` or
``prompt`` frame, an API request's messages): whether the model reads images, how many a prompt
may carry, each upload checked in its turn, and the bytes all those a session keeps may hold.

Given the size ``fit`` makes (``size``: ``EngineInfo.image_size``), the upload is brought down
toward it, to no less than twice it a side (``REDUCING_GAP``), as early as its format allows: a
JPEG decodes at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling, ``draft``); any other is flattened
to RGB over white right after it is decoded (the one full-size copy, where it is not RGB
already) and reduced by whole factors (``reduce``: box averages); only then is it transposed
upright and fitted. What one check holds at its peak, measured
(tests/images/test_image_memory.py): up to ``PEAK_BYTES_PER_PIXEL`` bytes per pixel of the
upload; WebP is the most (libwebp's animation decoder, which Pillow reads every WebP through,
keeps two canvases of its own while Pillow copies the frame out of it).
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PIL import ExifTags, Image, ImageFile, UnidentifiedImageError
from wschat.protocol import BadImage, ProtocolError, TooLarge, Unsupported

if TYPE_CHECKING:
    from ..engine import Engine
    from ..settings import Settings
    from .gates import Gate

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
# What Pillow's decoders raise on hostile or damaged input (its fuzzers expect the same set).
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, struct.error)
_WHITE = (255, 255, 255)
# Decoded at least this many times the kept size on each side (Pillow's thumbnail() gap): the
# fit's resize then reads as from the full image (5,000-pixel photos fitted to 896: a mean
# difference under half a level of 255; tests/images/test_image_memory.py).
REDUCING_GAP = 2
# The most one check holds at once, in bytes per pixel of the upload (an RGBA WebP at
# max_image_pixels, measured: 17.2; 4 bytes a pixel is the decoded bitmap alone).
PEAK_BYTES_PER_PIXEL = 18
# EXIF orientation -> the transpose that makes the image upright (ImageOps.exif_transpose's)
_UPRIGHT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_TURNED = frozenset({5, 6, 7, 8})  # width and height swap


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


@dataclass(frozen=True, slots=True)
class ImageRules:
    """A session's images and their limits; each refusal names the frame it refuses (``frame_id``)
    where there is one."""

    model: str
    reads_images: bool
    max_images: int  # per prompt (and per message of an API request)
    limits: ImageLimits
    max_held_bytes: int  # all a session keeps (--max-session-image-bytes)
    fit: Callable[[Image.Image], Any]  # the engine's ``prepare_image``
    size: tuple[int, int] | None  # what ``fit`` resizes to

    @classmethod
    def of(cls, engine: Engine, settings: Settings, max_images: int) -> ImageRules:
        info = engine.info
        limits = ImageLimits(settings.max_image_bytes, settings.max_image_pixels)
        held = settings.max_session_image_bytes
        fit, size = engine.prepare_image, info.image_size
        return cls(info.model, info.images, max_images, limits, held, fit, size)

    def require(self, frame_id: str | None = None) -> None:
        if not self.reads_images:
            raise Unsupported(f"the model {self.model!r} does not read images", id=frame_id)

    def count(self, total: int, frame_id: str | None = None, per: str = "prompt") -> None:
        """``total`` images in one prompt (``per``: or one message)."""
        if total > self.max_images:
            raise TooLarge(f"{total} images; at most {self.max_images} per {per}", id=frame_id)

    def stage(self, staged: int, frame_id: str) -> None:
        """One more image staged for the next prompt (``image`` frame), ``staged`` before it."""
        if staged + 1 > self.max_images:
            raise TooLarge(f"at most {self.max_images} images per prompt", id=frame_id)

    async def check(
        self, blobs: Sequence[bytes], gate: Gate, frame_id: str | None = None
    ) -> list[CheckedImage]:
        """The uploads in the form a session keeps (``fit``), each checked in a worker thread in
        its turn (``gate``: a few at once, server-wide); the first refusal raises."""
        try:
            return [
                await gate.thread(check_image, blob, self.limits, self.fit, self.size)
                for blob in blobs
            ]
        except ProtocolError as e:
            e.id = frame_id
            raise

    def budget(
        self,
        held: Sequence[Any],
        new: Sequence[CheckedImage],
        frame_id: str | None = None,
        whose: str = "this session's",
        advice: str = " (reset to start afresh)",
    ) -> None:
        """``TooLarge`` when the images a session keeps (``held``) and ``new`` would hold more
        than ``max_held_bytes`` (``whose`` and ``advice``: how the message names them)."""
        total = sum(image_bytes(image) for image in [*held, *(c.image for c in new)])
        if total > self.max_held_bytes:
            raise TooLarge(
                f"{whose} images would hold {total} bytes; max_session_image_bytes is"
                f" {self.max_held_bytes}{advice}",
                id=frame_id,
            )


def check_image(
    data: bytes,
    limits: ImageLimits,
    fit: Callable[[Image.Image], Any] | None = None,
    size: tuple[int, int] | None = None,
) -> CheckedImage:
    """The image as ``fit`` makes it (or decoded), or ``BadImage`` / ``TooLarge`` naming
    the rule; ``size``: the size ``fit`` resizes to, which the decode may stop short of."""
    if not data:
        raise BadImage("the image is empty")
    if len(data) > limits.max_bytes:
        raise TooLarge(f"the image is {len(data)} bytes; max_image_bytes is {limits.max_bytes}")
    if ImageFile.LOAD_TRUNCATED_IMAGES:  # it would pad a truncated file with grey and accept it
        raise RuntimeError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES must stay False")
    im = _open(data, limits)
    try:
        _check_pixels(im.size, limits)
        (width, height), fmt = im.size, str(im.format)
        try:
            decoded, orientation = _decode(im, size)
        except _DECODE_ERRORS as e:
            raise BadImage(f"the {fmt} image does not decode (truncated or corrupt)") from e
        rgb = _to_rgb(_upright(decoded, orientation))
        kept = rgb if fit is None else fit(rgb)
        if orientation in _TURNED:
            width, height = height, width
        # kept as it came: a copy, since closing the file's image lets its pixels go
        return CheckedImage(kept.copy() if kept is im else kept, width, height, fmt)
    finally:
        im.close()


def _decode(im: Image.Image, size: tuple[int, int] | None) -> tuple[Image.Image, int]:
    """The first frame, brought down toward ``size`` where it is far larger (a JPEG as it
    decodes, any other by whole factors once decoded), and its EXIF orientation."""
    if size is not None and im.format == "JPEG":
        side = REDUCING_GAP * max(size)  # either side may end up the width once upright
        im.draft(None, (side, side))
    im.load()  # the first frame only: later frames of an animation are never decoded
    orientation = im.getexif().get(ExifTags.Base.Orientation, 1)
    if size is None:
        return im, orientation
    side = REDUCING_GAP * max(size)
    factors = (max(1, im.width // side), max(1, im.height // side))
    if factors == (1, 1):
        return im, orientation
    # flattened over white first, as a smaller one is: the same pixels either way; whole
    # blocks only (Image.reduce averages a partial last one into a pixel of its own, which
    # would shift the image by up to half a pixel of the reduced size; at most factor - 1
    # pixels of the edge go)
    box = (0, 0, im.width - im.width % factors[0], im.height - im.height % factors[1])
    return _to_rgb(im).reduce(factors, box), orientation


def _upright(im: Image.Image, orientation: int) -> Image.Image:
    method = _UPRIGHT.get(orientation)
    return im if method is None else im.transpose(method)


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


def _has_alpha(im: Image.Image) -> bool:
    return "A" in im.getbands() or "transparency" in im.info


def _to_rgb(im: Image.Image) -> Image.Image:
    """Transparent areas become white (a screenshot's transparent margin is not black): pasted
    over a white image through its own alpha."""
    if im.mode == "RGB":
        return im
    if not _has_alpha(im):
        return im.convert("RGB")
    if im.mode not in ("RGBA", "LA"):
        im = im.convert("RGBA")  # a palette's transparency, as alpha
    white = Image.new("RGB", im.size, _WHITE)
    white.paste(im, mask=im)
    return white
