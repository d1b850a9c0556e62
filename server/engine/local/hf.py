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
    LogitsProcessor,
    LogitsProcessorList,
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
from ..stopping import final_reason, token_budget
from ..tokenizing import TextTokenizer
from .kvstore import (
    MIN_OPENING_TOKENS,
    SHARED_OPENINGS,
    CachedPrefix,
    KVStore,
    RingMark,
    cached_prefix,
    carried_marks,
    latest_mark,
    shared_length,
    window_holds,
)
from .loader import LoadedModel
from .memory import give_back, out_of_memory
from .sampling import Filters, penalize, row_generator, sample
from .streamer import StopWhen, TokenStreamer, cancel_or_stop
from .threads import ThreadPolicy

log = logging.getLogger("wschat.engine")

END_OF_TURN = "<end_of_turn>"


class HFEngine:
    name = "generate"

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        context_tokens: int = 8192,
        max_images: int = 4,
        kv_budget_bytes: int = 1 << 30,
        kv: KVStore | None = None,
        shared_openings: int = SHARED_OPENINGS,
        prompt_format: str = "auto",
        threads: ThreadPolicy | None = None,
        fills_openings: bool = True,
    ) -> None:
        """``shared_openings``: openings its own store keeps (``kv``: a store of the caller's,
        with its own); ``fills_openings``: whether its generations keep their prompt's opening
        there (the batched engine's image path does not: its openings are the batch's form)."""
        self.loaded = loaded
        self.threads = threads or ThreadPolicy()
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self._backend = self.tokenizer.backend_tokenizer
        limit = _model_context(self.model.config)
        images = _ImageLayout.of(loaded) if loaded.has_vision else None
        eos = frozenset(_eos_ids(self.model.generation_config, self.tokenizer))
        self.prompt_format = build_format(
            prompt_format, self.tokenizer, eos, instruction_tuned=loaded.instruction_tuned
        )
        self.info = EngineInfo(
            name=self.name,
            model=loaded.name,
            runs_on=loaded.device,
            backend=loaded.precision_name,
            context_tokens=min(context_tokens, limit),
            images=loaded.has_vision,
            max_images=max_images if loaded.has_vision else 0,
            prompt_format=self.prompt_format.name,
            vocab_size=int(self.model.get_input_embeddings().num_embeddings),
            fingerprint=fingerprint(
                _config_identity(self.model.config.to_dict()),
                vocabulary_fingerprint(self.tokenizer, self.tokenizer.get_vocab),
                self.prompt_format.name,
            ),
            image_size=images.input_size if images is not None else None,
        )
        self.kv = kv if kv is not None else KVStore(kv_budget_bytes, shared_openings)
        self.fills_openings = fills_openings
        text_config = self.model.config.get_text_config()
        self._window: int | None = getattr(text_config, "sliding_window", None)
        self.text_tokenizer = TextTokenizer()
        self._threads: set[threading.Thread] = set()
        self._images = images

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

    def streamer(self, bridge: LoopBridge, request: GenerationRequest) -> TokenStreamer:
        """Text for one reply: the format's end tokens and its leading space never shown."""
        fmt = self.prompt_format
        return TokenStreamer(
            self._backend,
            bridge.put,
            request.params.stop,
            end_ids=fmt.end_ids,
            labels=fmt.turn_labels,
            strip_leading_space=fmt.strips_leading_space,
        )

    def image_placeholder_ids(self) -> list[int]:
        """The prompt ids one image occupies (the chat puts one run per image in the turn)."""
        return list(self.image_layout.placeholder)

    def prepare_image(self, image: Image) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """A checked image (upright RGB) as the session keeps it: at the processor's input size
        (Gemma 3: 896x896, 2.4 MB), whatever size it was uploaded at."""
        return self.image_layout.input_form(image)

    @property
    def image_layout(self) -> _ImageLayout:
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
            prefix = cached_prefix(cache, list(prefix.ids), _cache_tensors(cache))
        n = self.reusable_length(prefix.ids, request)
        if n == len(prefix.ids):
            return prefix
        kept = crop_cache(prefix.cache, n, prefix.marks) if n else 0
        if kept == 0:
            return None
        marks = [m for m in prefix.marks if m.length <= kept]
        return cached_prefix(prefix.cache, prefix.ids[:kept], _cache_tensors(prefix.cache), marks)

    def generate_from(self, request: GenerationRequest, prefix: CachedPrefix | None) -> Generation:
        """Generate on top of ``prefix`` (a transformers ``Cache`` the prompt extends, as
        ``reusable`` gives it): only the prompt's tail is prefilled, and only the images in it
        are encoded."""
        generation = Generation(prompt_tokens=len(request.prompt_ids))
        generation.cached_tokens = len(prefix.ids) if prefix else 0
        bridge = LoopBridge(asyncio.get_running_loop(), generation)
        thread = threading.Thread(
            target=self._run,
            args=(request, generation, bridge, [prefix]),
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
        held: list[CachedPrefix | None],
    ) -> None:
        """``held`` hands the prefix over: once taken, only this generation's frames hold its
        cache, so a failed step's tensors go with its traceback."""
        finished = Finished(FinishReason.ERROR, error=RuntimeError("generation ended early"))
        streamer = self.streamer(bridge, request)
        oom = False
        try:
            self.threads.apply()
            finished = self._reply(request, generation, streamer, held.pop())
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
        prefix: CachedPrefix | None,
    ) -> Finished:
        cache = prefix.cache if prefix else DynamicCache(config=self.model.config)
        cached = len(prefix.ids) if prefix else 0
        # generate concatenates into new tensors: the ones the cache holds now stay as they are
        mark = _ring_mark(cache, cached) if prefix else None
        opening = _OpeningCopy(cache, self.opening_to_fill(request), self.model.config)
        ids = self._generate(request, generation, streamer, cache, cached, opening)
        if opening.copy is not None:
            shared = opening.copy
            self.kv.put_opening(
                cached_prefix(shared, ids[: opening.length], _cache_tensors(shared)),
                request.opening_scope,
            )
        if request.session_key:
            kept = ids[: cache.get_seq_length()]
            marks = carried_marks(prefix, mark)
            entry = cached_prefix(cache, kept, _cache_tensors(cache), marks)
            self.kv.put(request.session_key, entry)
        return Finished(self._reason(generation, streamer), tuple(streamer.generated))

    def _generate(
        self,
        request: GenerationRequest,
        generation: Generation,
        streamer: TokenStreamer,
        cache: Any,
        cached: int,
        opening: _OpeningCopy,
    ) -> list[int]:
        params = request.params
        device = self.model.device
        input_ids = torch.tensor([request.prompt_ids], dtype=torch.long, device=device)
        kwargs = _sampling_kwargs(params)
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


def _sampling_kwargs(params: SamplingParams) -> dict[str, Any]:
    # generate picks greedily from the scores the processors leave: the penalty's, then
    # _Draw's (one finite score, the drawn token). 1.0 and None keep generate's own penalty and
    # warpers out of it, whatever the model's generation_config says.
    processors: list[LogitsProcessor] = []
    if params.repetition_penalty != 1.0:
        processors.append(_Penalty(params.repetition_penalty))
    if params.temperature > 0:
        processors.append(_Draw(params))
    return {
        "temperature": 1.0,
        "repetition_penalty": 1.0,
        "do_sample": False,
        "top_k": None,
        "top_p": None,
        "min_p": None,
        "logits_processor": LogitsProcessorList(processors),
    }


class _Penalty(LogitsProcessor):
    """The repetition penalty of sampling.py, safe for every value the protocol allows, in
    place of generate's own (which turns the extremes into NaN)."""

    def __init__(self, penalty: float) -> None:
        self.penalty = penalty

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return penalize(scores, input_ids, self.penalty)


class _Draw(LogitsProcessor):
    """sampling.py's draw (temperature, top-k, top-p, min-p; no sort of the vocabulary, its
    own seeded generator) in place of generate's warpers and multinomial: every score but the
    drawn token's becomes -inf, and generate's greedy pick takes it."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.filters = Filters.of(params)
        self.generator: torch.Generator | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.generator is None:
            self.generator = row_generator(self.params, scores.device)
        picked = [sample(row.float(), self.filters, self.generator) for row in scores]
        out = torch.full_like(scores, -torch.inf)
        rows = torch.arange(len(picked), device=scores.device)
        out[rows, torch.tensor(picked, device=scores.device)] = 0.0
        return out


class _OpeningCopy:
    """The first ``length`` positions of the cache ``generate`` fills, copied at its first
    token (the prompt prefilled, nothing more yet): the opening ``KVStore.put_opening`` keeps.
    ``take`` is a stopping rule that never stops (``StopWhen``)."""

    def __init__(self, cache: Any, length: int, config: Any) -> None:
        self._cache, self.length, self._config = cache, length, config
        self.copy: DynamicCache | None = None
        self._taken = length == 0

    def take(self) -> bool:
        if not self._taken:
            self._taken = True
            self.copy = copied_cache(self._cache, self.length, self._config)
        return False


def copied_cache(cache: Any, length: int, config: Any) -> DynamicCache | None:
    """A new ``DynamicCache`` of the first ``length`` positions of ``cache``, in tensors of its
    own (``update`` concatenates into new ones); None where a layer no longer holds every
    one of them (a sliding layer past its window)."""
    copy = DynamicCache(config=config)
    target: Any
    for target, layer in zip(copy.layers, cache.layers, strict=True):
        if not layer.is_initialized:
            continue
        held = layer.keys.shape[-2]
        if held < length or layer.get_seq_length() != held:
            return None
        target.update(layer.keys[..., :length, :], layer.values[..., :length, :])
    return copy


def crop_cache(cache: Any, length: int, marks: Sequence[RingMark] = ()) -> int:
    """Cut a transformers ``DynamicCache`` back in place to its first ``length`` positions, or
    where a sliding layer no longer holds what position ``length`` reads (``window_holds``: its
    sliding layers keep the last ``window - 1`` positions, so only a cache still under the
    window), to the longest length one of ``marks`` serves (``latest_mark``): full layers cut
    back, the sliding ones the mark's. The length it is cut to, 0 where neither holds (then it
    is left as it was). Full layers become views of their tensors, which the next forward's
    concatenation replaces; sliding layers cut short are copies (see ``KVState.cropped``)."""
    total = cache.get_seq_length()
    if length == total:
        return length
    sliding = [layer for layer in cache.layers if getattr(layer, "is_sliding", False)]
    held = [layer for layer in sliding if layer.is_initialized]
    if all(window_holds(total - x.keys.shape[-2], length, x.sliding_window) for x in held):
        cache.crop(length - total)  # a negative count: the tokens to drop
        for layer in held:  # copied: they outlive the cut as the next turn's mark
            layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
        return length
    found = latest_mark(marks, length, sliding[0].sliding_window)
    if found is None:
        return 0
    mark, served = found
    for layer in cache.layers:
        if not getattr(layer, "is_sliding", False):
            layer.crop(mark.length - total)
    for layer, (keys, values) in zip(sliding, mark.ring, strict=True):
        layer.keys, layer.values, layer.cumulative_length = keys, values, mark.length
    return crop_cache(cache, served)  # within what the mark's ring holds


def _ring_mark(cache: Any, length: int) -> RingMark:
    """The sliding layers of ``cache`` (``length`` positions) as a mark of that length."""
    layers = [x for x in cache.layers if getattr(x, "is_sliding", False) and x.is_initialized]
    ring_from = max((length - x.keys.shape[-2] for x in layers), default=0)
    return RingMark(length, tuple((x.keys, x.values) for x in layers), ring_from)


def _cache_tensors(cache: Any) -> list[torch.Tensor]:
    layers = [layer for layer in cache.layers if layer.is_initialized]
    return [t for layer in layers for t in (layer.keys, layer.values)]


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


class _ImageLayout:
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
    def of(cls, loaded: LoadedModel) -> _ImageLayout:
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
