"""``HFEngine``: one ``model.generate`` per generation, each in its own worker thread.

The thread always delivers a terminal ``Finished`` from ``finally``, so an exception becomes an
``error`` + ``done`` for the client, never a hang. KV state is kept per session (``KVStore``) so a
conversation's later turns prefill only their new tokens.

Images (a model with a vision tower, loaded with its processor): each image takes the ids of
``image_placeholder_ids()`` in the prompt, exactly as ``Gemma3Processor`` expands its image token
(``\n\n<start_of_image>`` + N ``<image_soft_token>`` + ``<end_of_image>\n\n``). KV reuse holds
with images: a cached prefix covers whole earlier turns, so only the images of the uncached tail
are encoded (their ``pixel_values``), while ``token_type_ids`` span the whole prompt because the
bidirectional attention over each image's tokens is read by position. This gives the same logits
as re-prefilling everything (tests/images check it). A prefix that would cut an image's
placeholder run in two is cut back before the image, and so is one that would reach an image
of this turn: every image has the same placeholder ids, so only the earlier turns' images are
the ones the cache was made with.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL.Image import Image
from transformers import (
    Cache,
    DynamicCache,
    StoppingCriteriaList,
)
from wschat.protocol import FinishReason

from ..base import (
    EngineInfo,
    Finished,
    Generation,
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
from ..stopping import final_reason, token_budget
from ..token_bytes import TokenTexts
from ..tokenizing import TextTokenizer
from .dynamic_cache import OpeningCopy, cache_tensors, copied_cache, crop_cache, ring_mark
from .image_layout import ImageLayout
from .kvstore import (
    MIN_OPENING_TOKENS,
    CachedPrefix,
    KVStore,
    cached_prefix,
    carried_marks,
    shared_length,
)
from .loader import LoadedModel
from .logits_processors import Constrain, sampling_kwargs
from .logprobs import LogprobRecorder
from .memory import give_back, out_of_memory
from .options import DEFAULT_OPTIONS, LocalEngineOptions
from .streamer import StopWhen, TokenStreamer, cancel_or_stop
from .threads import ThreadPolicy

log = logging.getLogger("wschat.engine")

END_OF_TURN = "<end_of_turn>"


class HFEngine:
    name = "generate"

    def __init__(
        self,
        loaded: LoadedModel,
        options: LocalEngineOptions = DEFAULT_OPTIONS,
        *,
        threads: ThreadPolicy | None = None,
        kv: KVStore | None = None,
    ) -> None:
        """``kv``: a store of the caller's (else one of its own, of ``options``' budget)."""
        self.loaded = loaded
        loaded.prepare(1)  # generate's forwards take the head one row at a time
        self.threads = threads or ThreadPolicy()
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self._backend = self.tokenizer.backend_tokenizer
        limit = _model_context(self.model.config)
        images = ImageLayout.of(loaded) if loaded.has_vision else None
        eos = frozenset(_eos_ids(self.model.generation_config, self.tokenizer))
        self.prompt_format = build_format(
            options.prompt_format, self.tokenizer, eos, instruction_tuned=loaded.instruction_tuned
        )
        self.info = EngineInfo(
            name=self.name,
            model=loaded.name,
            runs_on=loaded.device,
            backend=loaded.precision_name,
            context_tokens=min(options.context_tokens, limit),
            images=loaded.has_vision,
            max_images=options.max_images if loaded.has_vision else 0,
            prompt_format=self.prompt_format.name,
            vocab_size=int(self.model.get_input_embeddings().num_embeddings),
            fingerprint=fingerprint(
                _config_identity(self.model.config.to_dict()),
                vocabulary_fingerprint(self.tokenizer, self.tokenizer.get_vocab),
                self.prompt_format.name,
            ),
            image_size=images.input_size if images is not None else None,
        )
        self.kv = (
            kv if kv is not None else KVStore(options.kv_budget_bytes, options.shared_openings)
        )
        text_config = self.model.config.get_text_config()
        self._window: int | None = getattr(text_config, "sliding_window", None)
        self.text_tokenizer = TextTokenizer()
        self._threads: set[threading.Thread] = set()
        self._images = images
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

    # -- what Chat uses --------------------------------------------------------------------

    def tokenize_text(self, text: str) -> list[int]:
        encoded = self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)
        return list(encoded["input_ids"])

    def token_id(self, token: str) -> int:
        return int(self.tokenizer.convert_tokens_to_ids(token))

    def forget(self, session_key: str) -> None:
        self.kv.forget(session_key)

    async def prepare_reply(self, params: SamplingParams) -> None:
        if params.response_format is not None:
            await self.grammars.prepare(params.response_format)

    def matcher(self, request: GenerationRequest) -> GrammarMatcher | None:
        """The reply's place in its response format's grammar (prepared), or None."""
        response_format = request.params.response_format
        return None if response_format is None else self.grammars.matcher(response_format)

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

    def image_placeholder_ids(self) -> list[int]:
        """The prompt ids one image occupies (the chat puts one run per image in the turn)."""
        return list(self.image_layout.placeholder)

    def prepare_image(self, image: Image) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """A checked image (upright RGB) as the session keeps it: at the processor's input size
        (Gemma 3: 896x896, 2.4 MB), whatever size it was uploaded at."""
        return self.image_layout.input_form(image)

    @property
    def image_layout(self) -> ImageLayout:
        if self._images is None:
            raise ImagesUnsupported(f"the model {self.info.model!r} does not read images")
        return self._images

    def generate(self, request: GenerationRequest) -> Generation:
        key = request.session_key
        prefix = (
            self.kv.take(key, request.prompt_ids, Cache, request.opening_scope) if key else None
        )
        return self.generate_from(request, self.reusable(prefix, request))

    def reusable_length(self, ids: list[int], request: GenerationRequest) -> int:
        """How many of a cache's tokens ``ids`` the request can reuse: those its prompt shares
        (short of its last), cut back before an image they would cut in two or that is not one
        of the earlier turns' (see the module docstring)."""
        n = shared_length(ids, request.prompt_ids)
        if self._images is None:
            return n
        earlier = len(request.images) - request.fresh_images
        return self._images.reusable_length(request.prompt_ids, n, earlier)

    def reusable(
        self, prefix: CachedPrefix | None, request: GenerationRequest
    ) -> CachedPrefix | None:
        """``prefix`` (a transformers ``Cache``) cut back to what the request reuses, or None
        where nothing is (``crop_cache``)."""
        if prefix is None:
            return None
        if prefix.shared:  # a pooled opening: this generation's own copy, which it may write
            cache = copied_cache(prefix.cache, len(prefix.ids), self.model.config)
            if cache is None:
                return None
            prefix = cached_prefix(cache, list(prefix.ids), cache_tensors(cache))
        n = self.reusable_length(prefix.ids, request)
        if n == len(prefix.ids):
            return prefix
        kept = crop_cache(prefix.cache, n, prefix.marks) if n else 0
        if kept == 0:
            return None
        marks = [m for m in prefix.marks if m.length <= kept]
        return cached_prefix(prefix.cache, prefix.ids[:kept], cache_tensors(prefix.cache), marks)

    def generate_from(self, request: GenerationRequest, prefix: CachedPrefix | None) -> Generation:
        """Generate on top of ``prefix`` (a transformers ``Cache`` the prompt extends, as
        ``reusable`` gives it): only the prompt's tail is prefilled, and only the images in it
        are encoded."""
        generation = Generation(prompt_tokens=len(request.prompt_ids))
        generation.cached_tokens = len(prefix.ids) if prefix else 0
        bridge = LoopBridge(asyncio.get_running_loop(), generation)
        streamer = self.streamer(bridge, request)
        matcher = self.matcher(request)
        constrain = None if matcher is None else Constrain(matcher, self.logits_width)
        thread = threading.Thread(
            target=self._run,
            args=(request, generation, bridge, streamer, constrain, [prefix]),
            name=f"wschat-generate-{request.session_key or '-'}",
            daemon=True,
        )
        self._threads.add(thread)
        thread.start()
        return generation

    async def reachable(self) -> bool:
        return True

    async def aclose(self) -> None:
        for thread in list(self._threads):
            await asyncio.to_thread(thread.join, 30)

    # -- the worker thread ---------------------------------------------------------------

    def _run(
        self,
        request: GenerationRequest,
        generation: Generation,
        bridge: LoopBridge,
        streamer: TokenStreamer,
        constrain: Constrain | None,
        held: list[CachedPrefix | None],
    ) -> None:
        """``held`` hands the prefix over: once taken, only this generation's frames hold its
        cache, so a failed step's tensors go with its traceback."""
        finished = Finished(FinishReason.ERROR, error=RuntimeError("generation ended early"))
        oom = False
        try:
            self.threads.apply()
            finished = self._reply(request, generation, streamer, constrain, held.pop())
        except BaseException as error:
            log.exception("generation failed")
            failure = out_of_memory(error)
            oom = failure is not None
            finished = Finished(FinishReason.ERROR, tuple(streamer.generated), failure or error)
        finally:
            try:
                streamer.end()
            finally:
                bridge.put(finished)
                self._threads.discard(threading.current_thread())
        if oom:  # the traceback, and the tensors it held, are gone
            give_back(self.model.device)

    def _reply(
        self,
        request: GenerationRequest,
        generation: Generation,
        streamer: TokenStreamer,
        constrain: Constrain | None,
        prefix: CachedPrefix | None,
    ) -> Finished:
        cache = prefix.cache if prefix else DynamicCache(config=self.model.config)
        cached = len(prefix.ids) if prefix else 0
        # generate concatenates into new tensors: the ones the cache holds now stay as they are
        mark = ring_mark(cache, cached) if prefix else None
        opening = OpeningCopy(cache, self.opening_to_fill(request), self.model.config)
        ids = self._generate(request, generation, streamer, constrain, cache, cached, opening)
        if opening.copy is not None:
            shared = opening.copy
            self.kv.put_opening(
                cached_prefix(shared, ids[: opening.length], cache_tensors(shared)),
                request.opening_scope,
            )
        if request.session_key:
            kept = ids[: cache.get_seq_length()]
            marks = carried_marks(prefix, mark)
            entry = cached_prefix(cache, kept, cache_tensors(cache), marks)
            self.kv.put(request.session_key, entry)
        return Finished(self._reason(generation, streamer), tuple(streamer.generated))

    def _generate(
        self,
        request: GenerationRequest,
        generation: Generation,
        streamer: TokenStreamer,
        constrain: Constrain | None,
        cache: Any,
        cached: int,
        opening: OpeningCopy,
    ) -> list[int]:
        params = request.params
        device = self.model.device
        input_ids = torch.tensor([request.prompt_ids], dtype=torch.long, device=device)
        kwargs = sampling_kwargs(params, streamer.recorder, constrain)
        if self._images is not None:
            kwargs |= self._images.model_inputs(input_ids, request.images, cached, self.model)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                cache=cache,
                max_new_tokens=token_budget(
                    params.max_new_tokens, self.info.context_tokens, len(request.prompt_ids)
                ),
                eos_token_id=sorted(self.prompt_format.end_ids),
                pad_token_id=self.tokenizer.pad_token_id,
                streamer=streamer,
                stopping_criteria=StoppingCriteriaList(
                    [
                        cancel_or_stop(generation.cancel_flag, streamer),
                        # only where there is an opening to copy: a criterion runs every step
                        *([StopWhen(opening.take)] if opening.length else []),
                    ]
                ),
                **kwargs,
            )
        return list(out[0].tolist())

    def opening_to_fill(self, request: GenerationRequest) -> int:
        """The length of the request's opening (``GenerationRequest.opening``) to keep for
        other sessions once its prefill is done, or 0: none is kept when it is short
        (``MIN_OPENING_TOKENS``), already kept, holds an image, or does not fit the sliding
        window (a ring holds every position of it only then)."""
        n = request.opening
        if self.kv.openings <= 0 or not MIN_OPENING_TOKENS <= n < len(request.prompt_ids):
            return 0
        if self._window is not None and n >= self._window:
            return 0
        ids = request.prompt_ids[:n]
        if self._images is not None and self._images.reusable_length(ids, n, 0) < n:
            return 0
        return 0 if self.kv.has_opening(ids, request.opening_scope) else n

    def _reason(self, generation: Generation, streamer: TokenStreamer) -> FinishReason:
        generated, ends = streamer.generated, self.prompt_format.end_ids
        return final_reason(
            cancelled=generation.cancel_flag.is_set(),
            stopped=streamer.stop_string_hit or bool(generated and generated[-1] in ends),
        )


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
