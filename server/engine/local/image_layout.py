"""``ImageLayout``: how images sit in a prompt for one vision model (each image's placeholder
ids, as ``Gemma3Processor`` expands its image token), the form the session keeps an image in (the
processor's input size), how far a cached prefix may reach without cutting an image in two, and
the inputs the images add to a forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL.Image import Image

from .loader import LoadedModel


class ImageLayout:
    """How images sit in a prompt for one vision model, and the inputs they add to generate."""

    def __init__(self, processor: Any, placeholder: list[int], image_token_id: int) -> None:
        self.processor = processor
        self.placeholder = tuple(placeholder)
        self.image_token_id = image_token_id
        self.tokens_per_image = placeholder.count(image_token_id)
        images = processor.image_processor
        if getattr(images, "do_pan_and_scan", False) or not images.do_resize:
            raise ValueError("images are kept at the processor's input size: it must resize")
        self.input_size = (int(images.size["width"]), int(images.size["height"]))
        self.resample = images.resample

    @classmethod
    def of(cls, loaded: LoadedModel) -> ImageLayout:
        processor = loaded.processor
        if processor is None:
            raise ValueError(f"{loaded.name} has no image processor")
        # Special tokens only: tokenizing the processor's own expansion gives its exact ids.
        expansion = processor.full_image_sequence
        placeholder = loaded.tokenizer(expansion, add_special_tokens=False)["input_ids"]
        return cls(processor, list(placeholder), int(loaded.model.config.image_token_id))

    def input_form(self, image: Image) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """The processor's first step, its resize (Pillow, with its filter), done once: run on
        the result, the processor resizes to the size it already has, a copy in Pillow, so the
        pixels it hands the model are the upload's (tests/images check it)."""
        return np.asarray(image.resize(self.input_size, resample=self.resample))

    def images_in(self, ids: list[int]) -> float:
        return ids.count(self.image_token_id) / self.tokens_per_image

    def reusable_length(self, ids: list[int], length: int, images: int) -> int:
        """The longest prefix of ``ids[:length]`` that cuts no image's placeholder run in two
        and holds at most ``images`` images."""
        lead = self.placeholder.index(self.image_token_id)  # run ids before its soft tokens
        stop = min(len(ids), length + lead)  # a run that starts before length
        held, at = 0, 0
        while True:
            try:
                at = ids.index(self.image_token_id, at, stop)
            except ValueError:
                return length
            start = at - lead
            if held == images or start + len(self.placeholder) > length:
                return start
            held += 1
            at += self.tokens_per_image

    def model_inputs(
        self, input_ids: torch.Tensor, images: Sequence[Any], cached: int, model: Any
    ) -> dict[str, Any]:
        """``token_type_ids`` over the whole prompt; ``pixel_values`` of the uncached images."""
        ids = input_ids[0].tolist()
        if self.images_in(ids) != len(images):
            raise ValueError(
                f"the prompt has room for {self.images_in(ids):g} images but {len(images)} came"
            )
        if not images:
            return {}
        inputs: dict[str, Any] = {"token_type_ids": (input_ids == self.image_token_id).long()}
        new = list(images[int(self.images_in(ids[:cached])) :])
        if new:
            pixels = self.processor.image_processor(new, return_tensors="pt")["pixel_values"]
            inputs["pixel_values"] = pixels.to(model.device, model.dtype)
        return inputs
