"""``BatchedEngine``: the generations of all sessions decode together, one forward pass a step.

It composes three parts, as vLLM's engine core and llama.cpp's server do: the ``Scheduler``
(``scheduler.py``, no torch: admission, burst gathering, each row's state and slot), the
``ModelRunner`` (``runner.py``: forwards, slot KV, logits, picks) and the ``OutputProcessor``
(``output.py``: picks to the row's stream, stops, finish reasons). One worker thread owns the
model while there is work (and exits when there is none; it is started from the event loop once
the callbacks already due have run). Each pass of its loop:

1. takes new requests in, up to ``width`` rows in all, once a burst of them has stopped arriving
   (the scheduler's gather: prompts that clients sent together start together);
2. prefills the prompts of the rows that joined (their uncached tails, all joiners in one
   forward, long prompts in chunks of ``prefill_tokens`` so the running rows never wait long);
   a row whose prompt is done picks its first token and joins the decode batch (a row admitted
   with a sibling's fed prompt, ``siblings.py``, picks it first, from that sibling's logits);
3. runs one decode forward over every decoding row, each at its own position (``SlotKV``), picks
   each row's token with its own parameters and streams it.

Every row lives in one ``SlotKV`` of ``width`` rows: the decoding rows first, the prefilling
ones after them, each forward over its own run of rows. A row whose prompt is done joins the
decoding rows where it is (the boundary moves past it; a swap of two rows when another prompt
ahead of it is still prefilling), so its cache, a session's whole conversation on a later turn,
is copied into the batch once (from the ``KVStore``), not again from a prefill buffer, and the
batch holds one set of KV buffers.

Cancel flags are read before every pass and again before a token is streamed, so a cancelled
row streams nothing more and its ``done`` comes within one decode step. A failure in one row's
own work (its token pick, its text, its finish) ends that row alone with an error (``error`` +
``done`` for its client) while its batch mates go on; a failed forward ends the rows it ran,
the prefilling ones or the decoding ones, and the others go on (a decode step out of memory
ends only the row that has generated least, and runs again without it); any other failure
of a pass ends every row in a slot, and the loop goes on with the rows that come next. KV
state is kept per session across turns in the ``LocalModel``'s ``KVStore`` (the same contract
as ``generate``'s): a prompt that extends a session's cached tokens prefills only the new ones.

Turns with new images go to the ``generate`` path over the same model (``GeneratePath``: one
``generate`` each), which encodes them. A later turn of that conversation without new images
comes back to the batch: the ``generate`` path's KV state (a transformers ``Cache``, in the same
``KVStore``) holds every earlier image's tokens, and is taken over as a ``KVState``
(``KVState.of_cache``) when the row joins, so the text-only tail is prefilled by the text
decoder alone. Where that state is gone (evicted), the turn goes to ``generate`` again, which
re-encodes the conversation's images.

Why not transformers' continuous batching manager (``model.init_continuous_batching()``), which
also streams, cancels and batches per request: ``python -m bench`` measures both against the
static-batch ceiling in the same runs, and on a CPU its paged cache runs through an sdpa
fallback that keeps it well below this engine at one stream and at eight. Its prefix
blocks are shared only while they stay in its cache, with no per-session budget, where each
session's KV state is kept here under ``kv_budget_bytes`` and evicted idle-first.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import replace

import torch
from transformers import Cache
from wschat.protocol import FinishReason

from ..base import Generation, GenerationRequest, LoopBridge
from ..stopping import token_budget
from .batch_width import width_for
from .generate_path import GeneratePath
from .kvstore import CachedPrefix, cached_prefix
from .loader import LoadedModel
from .memory import give_back, out_of_memory
from .model import LocalModel
from .options import DEFAULT_OPTIONS, LocalEngineOptions
from .output import OutputProcessor
from .rows import BatchRow
from .runner import ModelRunner
from .sampling import RowSampler
from .scheduler import RowState, Scheduler
from .sequence_kv import KVState, LayerLayout, layer_layout
from .siblings import Siblings
from .steps import RowEnd, StepKind, StepPlan, StepResult
from .threads import ThreadPolicy

log = logging.getLogger("wschat.engine.batched")


class ForwardFailed(Exception):
    """A forward of the worker's pass raised (its cause): the rows it ran, and whether the
    same forward may run again without the row it drops (a decode step). Never leaves the
    worker."""

    def __init__(self, rows: list[BatchRow], *, retries: bool) -> None:
        super().__init__(f"a forward of {len(rows)} rows failed")
        self.rows = rows
        self.retries = retries


class BatchedEngine(LocalModel):
    name = "batched"

    def __init__(
        self,
        loaded: LoadedModel,
        options: LocalEngineOptions = DEFAULT_OPTIONS,
        *,
        threads: ThreadPolicy | None = None,
    ) -> None:
        super().__init__(loaded, options, threads)
        self.path = GeneratePath(self)  # the turns with new images
        layout = layer_layout(loaded)
        width = options.width or self._auto_width(loaded, layout, options)
        self.info = replace(self.info, batch_width=width)
        self.width = width
        loaded.prepare(width)
        self.runner = ModelRunner(loaded, layout, width)
        self.scheduler: Scheduler[BatchRow] = Scheduler(
            self.runner, width, prefill_tokens=options.prefill_tokens, gather_s=options.gather_s
        )
        self.output = OutputProcessor(self.kv)
        self._worker: threading.Thread | None = None  # the latest worker (aclose joins it)
        self.prefill_forwards = 0
        self.decode_steps = 0
        self.decoded_tokens = 0
        # turns of image conversations, by the path that served them (see the module docstring)
        self.image_turns = {"batch": 0, "generate": 0}
        self.prefilled_tokens = 0  # prompt tokens fed by prefill forwards
        # replies to one prompt prefill it once (siblings.py); the loop rows are submitted on
        self.siblings = Siblings()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _auto_width(
        self, loaded: LoadedModel, layout: LayerLayout, options: LocalEngineOptions
    ) -> int:
        """The width where none was given: the device's, as the memory holds it
        (``batch_width.py``) at the engine's context, less the idle sessions' KV budget."""
        chosen = width_for(loaded, layout, self.info.context_tokens, options.kv_budget_bytes)
        log.info("batch width (--max-concurrent auto): %s", chosen.reason)
        return chosen.width

    def generate(self, request: GenerationRequest) -> Generation:
        kinds = (KVState, Cache) if request.images else KVState
        prefix = self.reusable(self.taken(request, kinds), request)
        if request.images:
            if request.fresh_images or not self._holds_every_image(request, prefix):
                self.image_turns["generate"] += 1
                usable = prefix if prefix and isinstance(prefix.cache, Cache) else None
                return self.path.start(request, usable)
            self.image_turns["batch"] += 1
        generation = Generation(prompt_tokens=len(request.prompt_ids))
        generation.cached_tokens = len(prefix.ids) if prefix else 0
        loop = asyncio.get_running_loop()
        bridge = LoopBridge(loop, generation)
        row = BatchRow(
            request,
            generation,
            bridge,
            self.streamer(bridge, request),
            RowSampler(request.params, request.prompt_ids, self.model.device),
            prefix,
            token_budget(
                request.params.max_new_tokens, self.info.context_tokens, len(request.prompt_ids)
            ),
            self.prompt_format.end_ids,
            opening=self.opening_to_fill(request),
            grammar=self.matcher(request),
        )
        self._loop = loop
        if self.siblings.join(row):  # a sibling prefills the same prompt: this one waits
            generation.cached_tokens = len(request.prompt_ids)
            return generation
        if self.scheduler.submit(row, loop):
            # After the callbacks already due: prompts that arrived together start together.
            loop.call_soon(self._wake)
        return generation

    def _holds_every_image(self, request: GenerationRequest, prefix: CachedPrefix | None) -> bool:
        """Whether ``prefix`` holds the KV state of every image of the conversation: then the
        rest of the prompt is text, which the batch prefills."""
        if prefix is None:
            return False
        return self.image_layout.images_in(prefix.ids) == len(request.images)

    def _wake(self) -> None:
        if self.scheduler.start_worker():
            self._worker = threading.Thread(
                target=self._work, name="wschat-generate-batch", daemon=True
            )
            self._worker.start()

    async def aclose(self) -> None:
        worker = self._worker
        if worker is not None:
            await asyncio.to_thread(worker.join, 30)
        await self.path.aclose()

    # -- the worker thread ---------------------------------------------------------------

    def _work(self) -> None:
        scheduler = self.scheduler
        with torch.inference_mode():
            while True:
                scheduler.gather()
                came, spread_s = scheduler.take_arrivals()
                if came:
                    log.debug(
                        "%d prompts in, reaching the engine over %.1f ms (at most %.1f ms "
                        "apart); %d rows busy",
                        came,
                        spread_s * 1000,
                        scheduler.widest_gap * 1000,
                        scheduler.rows,
                    )
                if scheduler.worker_done():
                    return
                try:
                    self._pass()
                except ForwardFailed as failed:
                    self._end_failed_forward(failed, failed.__cause__ or failed)
                except BaseException as error:
                    self._end_failed_pass(error)
                else:
                    continue
                # now that the pass's traceback is gone, so are the tensors it held
                give_back(self.model.device)

    def _end_failed_forward(self, failed: ForwardFailed, error: BaseException) -> None:
        """The rows of a forward that failed end with its error (``overloaded`` when memory ran
        out); the other rows go on. The forward wrote only its own rows' columns past their
        lengths, which never moved (``SlotKV.advance`` did not run), and a buffer that could not
        grow kept its width (``SlotKV._reserve``): every other row's state is as it was.

        A decode step out of memory ends only the row that has generated least (the least
        work lost) and runs again without it in the next pass: a step writes each row's new
        position alone, which the retry writes again, and its sampler picked nothing yet. A
        prefill chunk is not run again: its rows' rings already hold part of what it wrote."""
        ended = out_of_memory(error)
        rows = failed.rows
        if ended is not None and failed.retries and len(rows) > 1:
            rows = [min(reversed(rows), key=lambda row: len(row.streamer.generated))]
        log.error(
            "a batched forward failed; %d of its %d rows end with an error",
            len(rows),
            len(failed.rows),
            exc_info=error,
        )
        for row in reversed(rows):  # the last slot first: no other row's state moves
            self._retire(row, RowEnd(FinishReason.ERROR, ended or error))

    def _end_failed_pass(self, error: BaseException) -> None:
        """Every row in a slot ends with the pass's error (``overloaded`` when memory ran out),
        and the slot KV starts afresh: what a failed pass left in it is unknown. The rows still
        waiting go on."""
        scheduler = self.scheduler
        log.error(
            "a batched pass failed; its %d rows end with an error", scheduler.rows, exc_info=error
        )
        failed = scheduler.clear()
        self.output.fail(failed, out_of_memory(error) or error)
        for row in failed:
            self._orphans(row)
        try:
            self.runner.release()
        except Exception:  # no memory even for them: the old ones serve, cleared
            log.exception("the slot KV could not be made afresh")

    def _pass(self) -> None:
        self.threads.apply()  # auto: follows what other processes leave free
        self._end_cancelled()
        for row in self.scheduler.admit():  # cancelled while they waited
            self.runner.adopt(row)
            self.output.finish(row, FinishReason.CANCELLED, row.own_prefix_state)
            self._orphans(row)
        first = self.scheduler.plan_first()
        if first.rows:
            self._step(first)
        if self.scheduler.prefilling:
            self._step(self.scheduler.plan_prefill())
            self._end_cancelled()
        if self.scheduler.decoding_count:
            self._step(self.scheduler.plan_decode())

    def _end_cancelled(self) -> None:
        for state in (RowState.DECODING, RowState.PREFILLING):
            for row in self.scheduler.cancelled(state):
                self._retire(row, RowEnd(FinishReason.CANCELLED))

    def _step(self, plan: StepPlan[BatchRow]) -> None:
        """One step: the scheduler's plan run by the runner, its result streamed by the
        output; a row that ends leaves its slot, a row whose prompt is done starts decoding."""
        decode = plan.kind is StepKind.DECODE
        try:
            result = self.runner.execute(plan)
        except Exception as error:
            raise ForwardFailed(list(plan.rows), retries=decode) from error
        self.scheduler.ran(plan)
        if decode:
            self.decode_steps += 1
            self.decoded_tokens += len(plan.rows)
        elif plan.kind is StepKind.PREFILL:
            self._prefilled(plan, result)
        for row, end in self.output.update(plan, result):
            if end is not None:
                self._retire(row, end)
            elif not decode:
                self.scheduler.start_decoding(row)

    def _prefilled(self, plan: StepPlan[BatchRow], result: StepResult) -> None:
        """After a prefill forward: the openings it fed kept, and the siblings of the rows whose
        prompt it finished started (before a first token may end a row and move the slots)."""
        self.prefill_forwards += 1
        self.prefilled_tokens += sum(plan.counts)
        for j, row in enumerate(plan.rows):
            if row.opening and row.fed >= row.opening:
                self._keep_opening(row, plan.first + j)
        for j in plan.picks:
            self._start_siblings(plan.rows[j], plan.first + j, result.leaders.get(j))

    def _keep_opening(self, row: BatchRow, slot: int) -> None:
        """A copy of the row's opening, now fed, for the sessions that start with it; none
        once the prefill wrapped its rings (a prompt longer than the window in one chunk)."""
        n, row.opening = row.opening, 0
        if self.runner.kv.lengths[slot] > self.runner.layout.window:
            return
        state = self.runner.kv.save(slot, n)
        opening = cached_prefix(state, row.prompt_ids[:n], state.tensors())
        self.kv.put_opening(opening, row.request.opening_scope)

    def _start_siblings(self, row: BatchRow, slot: int, logits: torch.Tensor | None) -> None:
        """The rows that waited for ``row``'s prompt, fed now, each from a copy of its state
        and the logits of its last prompt token (siblings.py)."""
        followers = self.siblings.release(row)
        if logits is None:  # none waited as its logits were read: any since prefill alone
            self._prefill_alone(followers)
            return
        state = self.runner.save(slot)
        prefix = cached_prefix(state, list(row.prompt_ids), state.tensors(), shared=True)
        for follower in followers:
            follower.prefix, follower.fed, follower.first_logits = prefix, len(prefix.ids), logits
            self.scheduler.submit(follower, self._loop or asyncio.get_event_loop())

    def _orphans(self, row: BatchRow) -> None:
        """The rows that waited for ``row``, which ended before its prompt was fed."""
        self._prefill_alone(self.siblings.release(row))

    def _prefill_alone(self, rows: list[BatchRow]) -> None:
        """Rows that waited for a sibling's prefill, each to prefill on its own."""
        for follower in rows:
            follower.generation.cached_tokens = follower.fed
            self.scheduler.submit(follower, self._loop or asyncio.get_event_loop())

    def _retire(self, row: BatchRow, end: RowEnd) -> None:
        """End ``row`` (decoding or prefilling) as ``end`` says, keeping its KV state unless it
        failed, and free its slot."""
        slot = self.scheduler.slot_of(row)
        try:
            state = None if end.reason is FinishReason.ERROR else self.runner.save(slot)
            self.output.finish(row, end.reason, state, end.error)
        except Exception as error:
            log.exception("ending a row failed; it ends alone")
            self.output.finish(row, FinishReason.ERROR, None, error)  # its done, unless sent
        finally:
            self.scheduler.retire(row)
            self._orphans(row)
