"""``HFEngine``: the ``generate`` engine, every generation one ``model.generate`` in a worker
thread of its own (``generate_path.py``) over the ``LocalModel`` both local engines share.

KV state is kept per session (``KVStore``) so a conversation's later turns prefill only their
new tokens. Images (a model with a vision tower, loaded with its processor): each image takes
the ids of ``image_placeholder_ids()`` in the prompt, exactly as ``Gemma3Processor`` expands its
image token (``\n\n<start_of_image>`` + N ``<image_soft_token>`` + ``<end_of_image>\n\n``). KV
reuse holds with images: a prefix that would cut an image's placeholder run in two is cut back
before the image, and so is one that would reach an image of this turn
(``LocalModel.reusable_length``).
"""

from __future__ import annotations

from transformers import Cache

from ..base import Generation, GenerationRequest
from .generate_path import GeneratePath
from .loader import LoadedModel
from .model import LocalModel
from .options import DEFAULT_OPTIONS, LocalEngineOptions
from .threads import ThreadPolicy


class HFEngine(LocalModel):
    name = "generate"

    def __init__(
        self,
        loaded: LoadedModel,
        options: LocalEngineOptions = DEFAULT_OPTIONS,
        *,
        threads: ThreadPolicy | None = None,
    ) -> None:
        super().__init__(loaded, options, threads)
        self.path = GeneratePath(self)

    def generate(self, request: GenerationRequest) -> Generation:
        return self.path.start(request, self.reusable(self.taken(request, Cache), request))

    async def aclose(self) -> None:
        await self.path.aclose()
