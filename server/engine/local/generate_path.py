"""``GeneratePath``: one ``model.generate`` per generation, each in its own worker thread.

The ``generate`` engine serves every turn this way, and the batched engine the turns with new
images (its vision tower encodes them). The thread always delivers a terminal ``Finished`` from
``finally``, so an exception becomes an ``error`` + ``done`` for the client, never a hang; the
generation starts from a ``CachedPrefix`` (a transformers ``Cache``, ``LocalModel.reusable``)
and leaves its state in the model's ``KVStore`` for the session's next turn.

Images: a cached prefix covers whole earlier turns, so only the images of the uncached tail are
encoded (their ``pixel_values``), while ``token_type_ids`` span the whole prompt because the
bidirectional attention over each image's tokens is read by position. This gives the same logits
as re-prefilling everything (tests/images check it).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import torch
from transformers import DynamicCache, StoppingCriteriaList
from wschat.protocol import FinishReason

from ..base import Finished, Generation, GenerationRequest, LoopBridge
from ..stopping import final_reason, token_budget
from .dynamic_cache import OpeningCopy, cache_tensors, ring_mark
from .kvstore import CachedPrefix, cached_prefix, carried_marks
from .logits_processors import Constrain, sampling_kwargs
from .memory import give_back, out_of_memory
from .model import LocalModel
from .streamer import StopWhen, TokenStreamer, cancel_or_stop

log = logging.getLogger("wschat.engine")


class GeneratePath:
    def __init__(self, local: LocalModel) -> None:
        self.local = local
        local.loaded.prepare(1)  # generate's forwards take the head one row at a time
        self._threads: set[threading.Thread] = set()

    def start(self, request: GenerationRequest, prefix: CachedPrefix | None) -> Generation:
        """Generate on top of ``prefix`` (a transformers ``Cache`` the prompt extends, as
        ``LocalModel.reusable`` gives it): only the prompt's tail is prefilled, and only the
        images in it are encoded."""
        generation = Generation(prompt_tokens=len(request.prompt_ids))
        generation.cached_tokens = len(prefix.ids) if prefix else 0
        bridge = LoopBridge(asyncio.get_running_loop(), generation)
        streamer = self.local.streamer(bridge, request)
        matcher = self.local.matcher(request)
        constrain = None if matcher is None else Constrain(matcher, self.local.logits_width)
        thread = threading.Thread(
            target=self._run,
            args=(request, generation, bridge, streamer, constrain, [prefix]),
            name=f"wschat-generate-{request.session_key or '-'}",
            daemon=True,
        )
        self._threads.add(thread)
        thread.start()
        return generation

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
            self.local.threads.apply()
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
            give_back(self.local.model.device)

    def _reply(
        self,
        request: GenerationRequest,
        generation: Generation,
        streamer: TokenStreamer,
        constrain: Constrain | None,
        prefix: CachedPrefix | None,
    ) -> Finished:
        local = self.local
        cache = prefix.cache if prefix else DynamicCache(config=local.model.config)
        cached = len(prefix.ids) if prefix else 0
        # generate concatenates into new tensors: the ones the cache holds now stay as they are
        mark = ring_mark(cache, cached) if prefix else None
        opening = OpeningCopy(cache, local.opening_to_fill(request), local.model.config)
        ids = self._generate(request, generation, streamer, constrain, cache, cached, opening)
        if opening.copy is not None:
            shared = opening.copy
            local.kv.put_opening(
                cached_prefix(shared, ids[: opening.length], cache_tensors(shared)),
                request.opening_scope,
            )
        if request.session_key:
            kept = ids[: cache.get_seq_length()]
            marks = carried_marks(prefix, mark)
            entry = cached_prefix(cache, kept, cache_tensors(cache), marks)
            local.kv.put(request.session_key, entry)
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
        local, params = self.local, request.params
        model = local.model
        input_ids = torch.tensor([request.prompt_ids], dtype=torch.long, device=model.device)
        kwargs = sampling_kwargs(params, streamer.recorder, constrain)
        if local.images is not None:
            kwargs |= local.images.model_inputs(input_ids, request.images, cached, model)
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                cache=cache,
                max_new_tokens=token_budget(
                    params.max_new_tokens, local.info.context_tokens, len(request.prompt_ids)
                ),
                eos_token_id=sorted(local.prompt_format.end_ids),
                pad_token_id=local.tokenizer.pad_token_id,
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

    def _reason(self, generation: Generation, streamer: TokenStreamer) -> FinishReason:
        generated, ends = streamer.generated, self.local.prompt_format.end_ids
        return final_reason(
            cancelled=generation.cancel_flag.is_set(),
            stopped=streamer.stop_string_hit or bool(generated and generated[-1] in ends),
        )
