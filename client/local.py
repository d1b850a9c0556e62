"""Checks made before a frame leaves, so a mistake fails at the call with the error the server
would have sent (PROTOCOL.md "params", "Client frames")."""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

from wschat.protocol import GenerationParams, Limits, ProtocolError, parse_params
from wschat.protocol.fields import MAX_ID_CHARS

from .errors import BadFrameError, InvalidParamsError, TooLargeError


def local_params(params: Mapping[str, Any]) -> GenerationParams | None:
    """Keyword params as checked ``GenerationParams`` (None when there are none)."""
    if not params:
        return None
    wire = {k: list(v) if k == "stop" and isinstance(v, tuple) else v for k, v in params.items()}
    try:
        return parse_params(wire)
    except ProtocolError as e:
        raise InvalidParamsError(e.message) from None


def check_prompt_id(id: str, live: Container[str]) -> str:
    """A caller-chosen id: 1 to 64 characters, and not the id of a reply still running."""
    if not isinstance(id, str) or not 1 <= len(id) <= MAX_ID_CHARS:
        raise BadFrameError(f"id must be 1 to {MAX_ID_CHARS} characters")
    if id in live:
        raise InvalidParamsError(f"id {id!r} is the id of a reply still running", id=id)
    return id


def check_image_size(data: bytes, limits: Limits) -> None:
    if len(data) > limits.max_image_bytes:
        raise TooLargeError(
            f"image of {len(data)} bytes is over the server's {limits.max_image_bytes}"
        )


def check_frame_size(data: bytes, limits: Limits) -> None:
    if len(data) > limits.max_frame_bytes:
        raise TooLargeError(
            f"frame of {len(data)} bytes is over the server's {limits.max_frame_bytes}"
        )
