"""Image files for the image tests, made in memory with Pillow (and one PNG written by hand)."""

from __future__ import annotations

import io
import random
import struct
import zlib

from PIL import Image

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)
EXIF_ORIENTATION = 0x0112
ROTATE_90_CW = 6  # EXIF orientation: the stored image must turn 90 degrees to stand upright


def encoded(image: Image.Image, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def noise(width: int, height: int, seed: int = 0) -> Image.Image:
    """Incompressible content: a truncated file of it is missing real image data."""
    rng = random.Random(seed)
    return Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))


def png(width: int = 48, height: int = 32, color: tuple[int, int, int] = RED) -> bytes:
    return encoded(Image.new("RGB", (width, height), color), "PNG")


def jpeg(width: int = 48, height: int = 32) -> bytes:
    return encoded(noise(width, height), "JPEG", quality=90)


def rotated_jpeg(width: int = 40, height: int = 20) -> bytes:
    """Stored ``width`` x ``height``; upright it is ``height`` x ``width``."""
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = ROTATE_90_CW
    return encoded(noise(width, height), "JPEG", exif=exif.tobytes())


def animated_gif(width: int = 30, height: int = 20) -> bytes:
    frames = [Image.new("RGB", (width, height), c) for c in (RED, GREEN, BLUE)]
    return encoded(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)


def png_bomb(width: int = 20_000, height: int = 20_000) -> bytes:
    """A valid 1-bit PNG of ``width`` x ``height`` black pixels: tens of KB, huge when decoded."""
    row = b"\x00" * (1 + (width + 7) // 8)  # filter byte + packed bits
    packer = zlib.compressobj(9)
    body = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    chunks = chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunks


def tiff() -> bytes:
    return encoded(Image.new("RGB", (16, 16), RED), "TIFF")


def eps() -> bytes:
    return (
        b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 16 16\n%%EndComments\n"
        b"newpath 0 0 moveto 16 16 lineto stroke\nshowpage\n%%EOF\n"
    )


def photo(width: int, height: int, alpha: bool = False) -> Image.Image:
    """Smooth gradients, edges and some grain, as a photo has (noise alone is the worst case for
    any resize); with ``alpha``, a transparency gradient from left to right."""
    import numpy as np

    y, x = np.mgrid[0:height, 0:width]
    grain = np.random.default_rng(0).integers(0, 24, (height, width))
    bands = [
        127 + 120 * np.sin(x / 97.0),
        127 + 120 * np.cos(y / 61.0),
        (x // 80 + y // 80) % 2 * 200 + grain,
    ]
    if alpha:
        bands.append(255 * x / max(1, width - 1))
    pixels = np.stack(bands, -1).clip(0, 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGBA" if alpha else "RGB")
