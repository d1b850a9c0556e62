"""Image turns for an engine that serves a vision model: the conversation as
``/v1/chat/completions`` messages, each image a PNG data URI in its place.

Completions take token ids, but an engine takes images only through the chat API, which renders
the prompt with the model's own chat template. So a conversation with images is sent as the
messages the session's chat gives with its ids (``GenerationRequest.messages``): each turn's
text decoded from the ids it was prompted with, each image a data URI before the text, as in
the ids. An image's placeholder run (``<start_of_image>``, a soft token per image token,
``<end_of_image>``) is the context it takes in the engine; those ids are never sent.
A system prompt stays where Gemma 3's template puts it, at the head of the first user turn.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..base import Message

# Gemma 3's vision tower: every image is resized to this square and takes this many tokens.
IMAGE_SIZE = 896
TOKENS_PER_IMAGE = 256
_START, _SOFT, _END = "<start_of_image>", "<image_soft_token>", "<end_of_image>"


class VisionError(Exception):
    """A vocabulary without Gemma 3's image tokens: images cannot be placed in a prompt."""


@dataclass(frozen=True, slots=True)
class ImageTokens:
    start: int
    soft: int
    end: int
    per_image: int = TOKENS_PER_IMAGE

    @classmethod
    def of(cls, token_id: Callable[[str], int]) -> ImageTokens:
        try:
            start, end = token_id(_START), token_id(_END)
        except KeyError as missing:
            raise VisionError(f"the vocabulary has no Gemma 3 image markers ({missing})") from None
        try:
            soft = token_id(_SOFT)
        except KeyError:  # text-only vocabularies lack it; the run's length is what counts
            soft = start
        return cls(start, soft, end)

    def placeholder(self) -> list[int]:
        return [self.start, *[self.soft] * self.per_image, self.end]


def normalise(image: Any) -> Any:
    """A checked image (upright RGB, Pillow) at the vision tower's input size: what the engine
    would resize it to, done once here, so the data URI carries no more pixels than are used."""
    from PIL import Image

    size = (IMAGE_SIZE, IMAGE_SIZE)
    return image if image.size == size else image.resize(size, Image.Resampling.BILINEAR)


def data_uri(image: Any) -> str:
    """A Pillow image as a lossless PNG data URI."""
    out = io.BytesIO()
    image.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii")


def chat_messages(
    messages: Sequence[Message],
    decode: Callable[[Sequence[int]], str],
    system_gap: Sequence[int],
    encode: Callable[[Any], str] = data_uri,
) -> list[dict[str, Any]]:
    """The chat API's messages: a system prompt and ``system_gap`` (its ids, "\\n\\n") at the head
    of the first user turn, each user turn's images as data URIs before its text, and each run
    of text ids decoded as one."""
    out: list[dict[str, Any]] = []
    head: list[int] = []
    for message in messages:
        if message.role == "system":
            head = [*message.ids, *system_gap]
        elif message.role == "assistant":
            out.append({"role": "assistant", "content": decode(message.ids)})
        else:
            parts: list[dict[str, Any]] = []
            text, head = head, []
            for image in message.images:
                if text:
                    parts.append({"type": "text", "text": decode(text)})
                    text = []
                parts.append({"type": "image_url", "image_url": {"url": encode(image)}})
            text = [*text, *message.ids]
            if text:
                parts.append({"type": "text", "text": decode(text)})
            out.append({"role": message.role, "content": parts})
    return out
