"""Images as the bytes a frame carries: from a path, raw bytes or a PIL image (sent as PNG)."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import Any, TypeAlias

# A path, encoded image bytes, or a ``PIL.Image.Image`` (PIL stays an optional dependency).
ImageInput: TypeAlias = "str | os.PathLike[str] | bytes | bytearray | memoryview | Any"

_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
# Modes PNG can store as they are; anything else (CMYK, YCbCr, ...) is converted first.
_PNG_MODES = frozenset({"1", "L", "LA", "P", "RGB", "RGBA", "I", "I;16"})


def sniff_mime(data: bytes) -> str | None:
    """The MIME type the bytes' signature names, for the formats the server accepts."""
    for signature, mime in _SIGNATURES:
        if data.startswith(signature):
            return mime
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _is_pil_image(value: object) -> bool:
    module = sys.modules.get("PIL.Image")
    return module is not None and isinstance(value, module.Image)


def _png_bytes(image: Any) -> bytes:
    if image.mode not in _PNG_MODES:
        has_alpha = "A" in image.getbands() or "transparency" in image.info
        image = image.convert("RGBA" if has_alpha else "RGB")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def image_bytes(image: ImageInput) -> tuple[bytes, str | None]:
    """``(data, mime)`` for an image input; ``mime`` is None when the bytes name no known format.

    Raises ``TypeError`` for anything else and ``OSError`` for an unreadable path.
    """
    if isinstance(image, bytes | bytearray | memoryview):
        data = bytes(image)
        return data, sniff_mime(data)
    if isinstance(image, str | os.PathLike):
        data = Path(image).read_bytes()
        return data, sniff_mime(data)
    if _is_pil_image(image):
        return _png_bytes(image), "image/png"
    raise TypeError(f"an image must be a path, bytes or a PIL image, not {type(image).__name__}")
