"""Image turns for an engine that serves a vision model: the conversation as
``/v1/chat/completions`` messages, each image a PNG data URI in its place.

Completions take token ids, but an engine takes images only through the chat API, which renders
the prompt with the model's own chat template. So a conversation with images is sent as
messages, read back from the very ids the session rendered (Gemma turns): each turn's role and
text, and each image's placeholder run (``<start_of_image>``, a soft token per image token,
``<end_of_image>``: the context it takes in the engine; these ids are never sent) replaced by the
next image.
A system prompt stays where Gemma 3's template puts it, at the head of the first user turn.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True, slots=True)
class TurnTokens:
    """The Gemma turn markup, as ids: ``<start_of_turn>``, ``<end_of_turn>`` and the roles'
    ``user\\n`` and ``model\\n``."""

    start: int
    end: int
    user: tuple[int, ...]
    model: tuple[int, ...]


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
    prompt_ids: Sequence[int],
    images: Sequence[Any],
    turns: TurnTokens,
    image: ImageTokens,
    decode: Callable[[Sequence[int]], str],
    encode: Callable[[Any], str] = data_uri,
) -> list[dict[str, Any]]:
    """The messages of a Gemma-turns prompt (ending with the open model turn), with the
    images, in order, where their placeholders stand."""
    messages: list[dict[str, Any]] = []
    left = list(images)
    for role, content in _turns(prompt_ids, turns):
        if role == "assistant":
            messages.append({"role": role, "content": decode(content)})
            continue
        parts: list[dict[str, Any]] = []
        text: list[int] = []
        i = 0
        while i < len(content):
            if content[i] != image.start:
                text.append(content[i])
                i += 1
                continue
            if text:
                parts.append({"type": "text", "text": decode(text)})
                text = []
            end = content.index(image.end, i)
            if not left:
                raise ValueError("more image placeholders in the prompt than images")
            parts.append({"type": "image_url", "image_url": {"url": encode(left.pop(0))}})
            i = end + 1
        if text:
            parts.append({"type": "text", "text": decode(text)})
        messages.append({"role": role, "content": parts})
    if left:
        raise ValueError(f"{len(left)} images without a placeholder in the prompt")
    return messages


def _turns(ids: Sequence[int], turns: TurnTokens) -> list[tuple[str, list[int]]]:
    """(role, content ids) of each closed turn; the open model turn at the end is left out
    (the chat API adds it)."""
    out: list[tuple[str, list[int]]] = []
    i = 0
    while True:
        try:
            start = list(ids).index(turns.start, i)
        except ValueError:
            return out
        body = list(ids[start + 1 :])
        roles = (("user", turns.user), ("assistant", turns.model))
        found = [(r, m) for r, m in roles if tuple(body[: len(m)]) == m]
        if not found:
            raise ValueError(f"a turn of an unknown role at id {start}")
        role, marker = found[0]
        if turns.end not in body:
            if role == "assistant" and len(body) == len(marker):
                return out  # the open model turn: where the reply begins
            raise ValueError("a turn that is never closed before the reply")
        close = body.index(turns.end)
        out.append((role, body[len(marker) : close]))
        i = start + 1 + close + 1
