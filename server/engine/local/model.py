"""``LocalModel``: the model loaded in this process, as each local engine serves it.

Both local engines are one: the ``generate`` engine (``hf.py``: one ``model.generate`` per
generation, ``generate_path.py``) and the batched one (``batched.py``). What they share is
here, written once: the tokenizer and the prompt format prompts are rendered with, the
``EngineInfo``, where a vision model's images sit in a prompt (``ImageLayout``), each reply's
``TokenStreamer`` (with its logprobs where it asked) and grammar (structured output), and prefix
reuse: the session's KV state kept between turns (one
``KVStore`` of the options' budget) and how much of it a request reuses, cut back before an
image it would cut in two or that is not one of the earlier turns'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from PIL.Image import Image

from ..base import (
    EngineInfo,
    GenerationRequest,
    KVUsage,
    LoopBridge,
    SamplingParams,
    fingerprint,
    vocabulary_fingerprint,
)
from ..errors import ImagesUnsupported
from ..formats import build_format
from ..grammar import GrammarCompiler, GrammarMatcher, Grammars
from ..token_bytes import TokenTexts
from ..tokenizing import TextTokenizer
from .dynamic_cache import cache_tensors, copied_cache, crop_cache
from .image_layout import ImageLayout
from .kvstore import MIN_OPENING_TOKENS, CachedPrefix, KVStore, cached_prefix, shared_length
from .loader import LoadedModel
from .logprobs import LogprobRecorder
from .options import LocalEngineOptions
from .sequence_kv import KVState
from .streamer import TokenStreamer
from .threads import ThreadPolicy

END_OF_TURN = "<end_of_turn>"


class LocalModel:
    """What a local engine is over the loaded model; each engine adds how it generates."""

    name: ClassVar[str]

    def __init__(
        self, loaded: LoadedModel, options: LocalEngineOptions, threads: ThreadPolicy | None
    ) -> None:
        self.loaded = loaded
        self.threads = threads or ThreadPolicy()
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self._backend = self.tokenizer.backend_tokenizer
        # where the images of a prompt sit (None: the model reads none)
        self.images = ImageLayout.of(loaded) if loaded.has_vision else None
        eos = frozenset(_eos_ids(self.model.generation_config, self.tokenizer))
        self.prompt_format = build_format(
            options.prompt_format, self.tokenizer, eos, instruction_tuned=loaded.instruction_tuned
        )
        self.info = EngineInfo(
            name=self.name,
            model=loaded.name,
            runs_on=loaded.device,
            backend=loaded.precision_name,
            context_tokens=min(options.context_tokens, _model_context(self.model.config)),
            images=loaded.has_vision,
            max_images=options.max_images if loaded.has_vision else 0,
            prompt_format=self.prompt_format.name,
            vocab_size=int(self.model.get_input_embeddings().num_embeddings),
            fingerprint=fingerprint(
                _config_identity(self.model.config.to_dict()),
                vocabulary_fingerprint(self.tokenizer, self.tokenizer.get_vocab),
                self.prompt_format.name,
            ),
            image_size=self.images.input_size if self.images is not None else None,
        )
        # one store, one budget: every path of an engine keeps its state here
        self.kv = KVStore(options.kv_budget_bytes, options.shared_openings)
        text_config = self.model.config.get_text_config()
        self.window: int | None = getattr(text_config, "sliding_window", None)
        self.text_tokenizer = TextTokenizer()
        # structured output: the vocabulary's grammar side built at the first format
        self.grammars = Grammars(self._grammar_compiler)
        self.token_texts = TokenTexts(self._backend)  # what a logprob shows of a token
        self.logits_width = int(self.model.get_output_embeddings().out_features)

    def _grammar_compiler(self) -> GrammarCompiler:
        return GrammarCompiler(self._backend, self.logits_width, sorted(self.prompt_format.end_ids))

    # -- the Engine interface ------------------------------------------------------------

    def kv_usage(self) -> KVUsage:
        return self.kv.usage()

    def worker_threads(self) -> int | None:
        return self.threads.in_worker

    def forget(self, session_key: str) -> None:
        self.kv.forget(session_key)

    async def reachable(self) -> bool:
        return True

    async def prepare_reply(self, params: SamplingParams) -> None:
        if params.response_format is not None:
            await self.grammars.prepare(params.response_format)

    # -- what Chat uses --------------------------------------------------------------------

    def tokenize_text(self, text: str) -> list[int]:
        encoded = self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)
        return list(encoded["input_ids"])

    def token_id(self, token: str) -> int:
        return int(self.tokenizer.convert_tokens_to_ids(token))

    def image_placeholder_ids(self) -> list[int]:
        """The prompt ids one image occupies (the chat puts one run per image in the turn)."""
        return list(self.image_layout.placeholder)

    def prepare_image(self, image: Image) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """A checked image (upright RGB) as the session keeps it: at the processor's input size
        (Gemma 3: 896x896, 2.4 MB), whatever size it was uploaded at."""
        return self.image_layout.input_form(image)

    @property
    def image_layout(self) -> ImageLayout:
        if self.images is None:
            raise ImagesUnsupported(f"the model {self.info.model!r} does not read images")
        return self.images

    # -- what each generation uses -------------------------------------------------------

    def streamer(self, bridge: LoopBridge, request: GenerationRequest) -> TokenStreamer:
        """Text for one reply: the format's end tokens and its leading space never shown; each
        token's logprobs with it where the request asked."""
        fmt = self.prompt_format
        top = request.params.logprobs
        return TokenStreamer(
            self._backend,
            bridge.put,
            request.params.stop,
            end_ids=fmt.end_ids,
            labels=fmt.turn_labels,
            strip_leading_space=fmt.strips_leading_space,
            recorder=None if top is None else LogprobRecorder(top, self.token_texts),
        )

    def matcher(self, request: GenerationRequest) -> GrammarMatcher | None:
        """The reply's place in its response format's grammar (prepared), or None."""
        params = request.params
        if params.response_format is None:
            return None
        return self.grammars.matcher(params.response_format, params.max_new_tokens)

    def taken(
        self, request: GenerationRequest, kinds: type | tuple[type, ...]
    ) -> CachedPrefix | None:
        """The session's kept state of one of ``kinds`` that the request's prompt extends (or a
        shared opening it starts with), taken out of the store; None without a session."""
        key = request.session_key
        return self.kv.take(key, request.prompt_ids, kinds, request.opening_scope) if key else None

    def reusable_length(self, ids: list[int], request: GenerationRequest) -> int:
        """How many of a cache's tokens ``ids`` the request can reuse: those its prompt shares
        (short of its last), cut back before an image they would cut in two or that is not one
        of the earlier turns' (every image has the same placeholder ids, so only the earlier
        turns' images are the ones the cache was made with)."""
        n = shared_length(ids, request.prompt_ids)
        if self.images is None:
            return n
        earlier = len(request.images) - request.fresh_images
        return self.images.reusable_length(request.prompt_ids, n, earlier)

    def reusable(
        self, prefix: CachedPrefix | None, request: GenerationRequest
    ) -> CachedPrefix | None:
        """``prefix`` cut back to what the request reuses (``reusable_length``), in the form it
        is in (the batch's ``KVState`` or a transformers ``Cache``), or None where nothing is.
        A pooled opening as a ``Cache`` becomes this generation's own copy, which it may write;
        as a ``KVState`` it stays shared (the batch copies it into its slot)."""
        if prefix is None:
            return None
        if prefix.shared and not isinstance(prefix.cache, KVState):
            copy = copied_cache(prefix.cache, len(prefix.ids), self.model.config)
            if copy is None:
                return None
            prefix = cached_prefix(copy, list(prefix.ids), cache_tensors(copy))
        n = self.reusable_length(prefix.ids, request)
        if n == len(prefix.ids):
            return prefix
        if isinstance(prefix.cache, KVState):
            assert self.window is not None  # a KVState is made of a model with sliding layers
            state = prefix.cache.cut(n, prefix.marks, self.window)
            if state is None:
                return None
            cache, kept, tensors = state, state.length, state.tensors()
        else:
            kept = crop_cache(prefix.cache, n, prefix.marks) if n else 0
            if kept == 0:
                return None
            cache, tensors = prefix.cache, cache_tensors(prefix.cache)
        marks = [m for m in prefix.marks if m.length <= kept]
        return cached_prefix(cache, prefix.ids[:kept], tensors, marks, shared=prefix.shared)

    def opening_to_fill(self, request: GenerationRequest) -> int:
        """The length of the request's opening (``GenerationRequest.opening``) to keep for
        other sessions once its prefill is done, or 0: none is kept when it is short
        (``MIN_OPENING_TOKENS``), already kept, holds an image, or does not fit the sliding
        window (a ring holds every position of it only then)."""
        n = request.opening
        if self.kv.openings <= 0 or not MIN_OPENING_TOKENS <= n < len(request.prompt_ids):
            return 0
        if self.window is not None and n >= self.window:
            return 0
        ids = request.prompt_ids[:n]
        if self.images is not None and self.images.reusable_length(ids, n, 0) < n:
            return 0
        return 0 if self.kv.has_opening(ids, request.opening_scope) else n


def _model_context(config: Any) -> int:
    text = getattr(config, "text_config", config)
    return int(getattr(text, "max_position_embeddings", 8192))


def _config_identity(config: dict[str, Any]) -> dict[str, Any]:
    """A model's config without what differs between replicas of one model: its path, the
    dtype it was loaded in, private and version fields."""
    volatile = {"torch_dtype", "dtype", "transformers_version", "name_or_path"}
    return {
        k: _config_identity(v) if isinstance(v, dict) else v
        for k, v in config.items()
        if not str(k).startswith("_") and k not in volatile
    }


def _eos_ids(generation_config: Any, tokenizer: Any) -> tuple[int, ...]:
    ids: list[int] = []
    configured = generation_config.eos_token_id
    if isinstance(configured, int):
        ids.append(configured)
    elif isinstance(configured, Sequence):
        ids.extend(int(i) for i in configured)
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    eot = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if isinstance(eot, int) and eot != tokenizer.unk_token_id:
        ids.append(eot)
    return tuple(dict.fromkeys(ids))
