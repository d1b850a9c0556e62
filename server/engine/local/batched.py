"""``BatchedEngine``: the generations of all sessions decode together, one forward pass a step.

One worker thread owns the model while there is work (and exits when there is none; it is
started from the event loop once the callbacks already due have run). Each pass of its loop:

1. takes new requests in, up to ``width`` rows in all, once a burst of them has stopped arriving:
   no new prompt for ``gather_s`` and none in the event loop's next ``SETTLE_TURNS`` iterations
   after that (a loop held up, by a thread start or a collection, has frames it read and has not
   handed over yet), never longer than ``GATHER_CAP_S`` from the first while rows decode (they
   wait for it) or ``IDLE_GATHER_CAP_S`` while none does. Prompts that clients sent together
   reach the engine over some loop iterations (one socket each), and a prefill started on the
   first of them makes the rest wait for its forward and a decode step before their own: 8
   prompts sent at once got their first tokens in about 2x the static batch's time whenever the
   burst split;
2. prefills the prompts of the rows that joined (their uncached tails, all joiners in one
   forward, long prompts in chunks of ``prefill_tokens`` so the running rows never wait long);
   a row whose prompt is done picks its first token and joins the decode batch;
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
``done`` for its client) while its batch mates go on; a failure of the shared forward pass ends
every row in it, and the loop goes on with the rows that come next. KV state is kept per
session across turns in a ``KVStore`` (the same contract as ``HFEngine``): a prompt that
extends a session's cached tokens prefills only the new ones.

Turns with new images go to an ``HFEngine`` over the same model (one ``generate`` each), which
encodes them. A later turn of that conversation without new images comes back to the batch: the
``generate`` path's KV state (a transformers ``Cache``, in the same ``KVStore``) holds every
earlier image's tokens, and is taken over as a ``KVState`` (``KVState.of_cache``) when the row
joins, so the text-only tail is prefilled by the text decoder alone. Where that state is gone
(evicted), the turn goes to ``generate`` again, which re-encodes the conversation's images.

Why not transformers' continuous batching manager (``model.init_continuous_batching()``), which
also streams, cancels and batches per request: ``python -m bench`` measures it in process in the
same runs, and on the 2-core CPU it reached 0.63-0.75x of the static-batch ceiling at 8 streams
and 0.65-0.70x at one stream (on CPU its paged cache runs through an sdpa fallback, and it logs
that it wants flash attention), where this engine reaches about 0.9-1.0x at both. Its prefix
blocks are shared only while they stay in its cache, with no per-session budget, where each
session's KV state is kept here under ``kv_budget_bytes`` and evicted idle-first.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from PIL.Image import Image
from transformers import Cache
from wschat.protocol import FinishReason

from ..base import Generation, GenerationRequest, KVUsage, LoopBridge
from ..history import TokenChat
from .hf import HFEngine
from .kvstore import CachedPrefix, KVStore
from .loader import LoadedModel
from .rows import BatchRow
from .sampling import RowSampler, pick_tokens
from .slotkv import KVState, LayerLayout, SlotKV
from .threads import ThreadPolicy

log = logging.getLogger("wschat.engine.batched")

# A burst of prompts is admitted once none came for GATHER_S (prompts sent together reach the
# engine 0.5-1 ms apart on 2 CPU cores) and the event loop then turned SETTLE_TURNS times without
# one. A frame takes a few turns from its socket to the engine, and when a batch ends the loop
# hands its freed slots to queued sessions over 10-25 ms, up to 10 ms apart: 4 turns let 3 of 14
# such bursts split at width 8, 16 none of 11, and 16 turns of an idle loop cost a lone prompt
# about 0.05 ms. At most GATHER_CAP_S after the first arrived while other rows decode,
# IDLE_GATHER_CAP_S while none does (a burst split in two costs its second half a whole prefill
# and decode step, far more than the wait).
GATHER_S = 0.002
SETTLE_TURNS = 16
GATHER_CAP_S = 0.010
IDLE_GATHER_CAP_S = 0.050


class BatchedEngine:
    name = "batched"

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        width: int = 8,
        context_tokens: int = 8192,
        max_images: int = 4,
        kv_budget_bytes: int = 1 << 30,
        prefill_tokens: int = 512,
        prompt_format: str = "auto",
        threads: ThreadPolicy | None = None,
        gather_s: float = GATHER_S,
    ) -> None:
        self.kv = KVStore(kv_budget_bytes)  # one budget: the image path keeps its state here too
        self.threads = threads or ThreadPolicy()
        self.single = HFEngine(
            loaded,
            context_tokens=context_tokens,
            max_images=max_images,
            kv=self.kv,
            prompt_format=prompt_format,
            threads=self.threads,
        )
        self.info = replace(self.single.info, name=self.name, batch_width=width)
        self.prompt_format = self.single.prompt_format
        self.text_tokenizer = self.single.text_tokenizer
        self.model = loaded.model
        inner = self.model.model
        self._text = getattr(inner, "language_model", inner)  # the decoder stack, text only
        self._lm_head = self.model.lm_head
        text_config = getattr(self.model.config, "text_config", self.model.config)
        self._softcap = getattr(text_config, "final_logit_softcapping", None)
        self._pad_id = int(loaded.tokenizer.pad_token_id or 0)
        self.width = width
        self.prefill_tokens = prefill_tokens
        self.gather_s = gather_s
        self.gather_cap_s = max(gather_s, GATHER_CAP_S)
        self.idle_gather_cap_s = max(gather_s, IDLE_GATHER_CAP_S)
        self._layout = LayerLayout.of(text_config, loaded.dtype, self.model.device)
        # One set of buffers: the decoding rows first, then the prefilling ones, so a row whose
        # prompt is done starts decoding where it is (no copy of its cache) and the rows of a
        # width need one row of KV buffers each (worker thread only, like the lists)
        self._kv = SlotKV(self._layout, width)
        self._decoding: list[BatchRow] = []  # row b of _kv
        self._prefilling: list[BatchRow] = []  # row len(_decoding) + j of _kv
        self._waiting: deque[BatchRow] = deque()  # admitted by start, no row yet (worker only)
        # guards _inbox, its arrival times and _worker: generate() appends on the loop; the
        # worker drains and exits
        self._lock = threading.Lock()
        self._inbox: list[BatchRow] = []
        self._first_arrival = 0.0  # when the oldest row of _inbox came (time.monotonic)
        self._last_arrival = 0.0  # when the newest did
        self._widest_gap = 0.0  # the longest wait between two of them (logged, to tune gather_s)
        self._arrivals = 0  # prompts ever put in _inbox: the gather sees whether more came
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop generate() runs on
        self._worker: threading.Thread | None = None
        self._wake_pending = False
        self.prefill_forwards = 0
        self.decode_steps = 0
        self.decoded_tokens = 0
        # turns of image conversations, by the path that served them (see the module docstring)
        self.image_turns = {"batch": 0, "generate": 0}

    # -- the Engine interface ------------------------------------------------------------

    def chat(self, key: str) -> TokenChat:
        return TokenChat(self, key)

    def kv_usage(self) -> KVUsage:
        return self.kv.usage()  # the generate path's state too: one store, one budget

    def worker_threads(self) -> int | None:
        return self.threads.in_worker

    # -- what TokenChat uses ---------------------------------------------------------------

    def tokenize_text(self, text: str) -> list[int]:
        return self.single.tokenize_text(text)

    def token_id(self, token: str) -> int:
        return self.single.token_id(token)

    def image_placeholder_ids(self) -> list[int]:
        return self.single.image_placeholder_ids()

    def prepare_image(self, image: Image) -> np.ndarray[Any, np.dtype[np.uint8]]:
        return self.single.prepare_image(image)

    def forget(self, session_key: str) -> None:
        self.kv.forget(session_key)  # the image path's state too: one store

    def generate(self, request: GenerationRequest) -> Generation:
        key = request.session_key
        kinds = (KVState, Cache) if request.images else KVState
        prefix = self.kv.take(key, request.prompt_ids, kinds) if key else None
        if request.images:
            if request.fresh_images or not self._holds_every_image(request, prefix):
                self.image_turns["generate"] += 1
                usable = prefix if prefix and isinstance(prefix.cache, Cache) else None
                return self.single.generate_from(request, usable)
            self.image_turns["batch"] += 1
        generation = Generation(prompt_tokens=len(request.prompt_ids))
        generation.cached_tokens = len(prefix.ids) if prefix else 0
        room = self.info.context_tokens - len(request.prompt_ids)
        loop = asyncio.get_running_loop()
        bridge = LoopBridge(loop, generation)
        row = BatchRow(
            request,
            generation,
            bridge,
            self.single.streamer(bridge, request),
            RowSampler(request.params, request.prompt_ids, self.model.device),
            prefix,
            max(1, min(request.params.max_new_tokens, room)),
            self.prompt_format.end_ids,
        )
        with self._lock:
            now = time.monotonic()
            if self._inbox:
                self._widest_gap = max(self._widest_gap, now - self._last_arrival)
            else:
                self._first_arrival, self._widest_gap = now, 0.0
            self._last_arrival = now
            self._inbox.append(row)
            self._arrivals += 1
            self._loop = loop
            wake = self._worker is None and not self._wake_pending
            self._wake_pending = self._wake_pending or wake
        if wake:
            # After the callbacks already due: prompts that arrived together start together.
            loop.call_soon(self._wake)
        return generation

    def _holds_every_image(self, request: GenerationRequest, prefix: CachedPrefix | None) -> bool:
        """Whether ``prefix`` holds the KV state of every image of the conversation: then the
        rest of the prompt is text, which the batch prefills."""
        if prefix is None:
            return False
        return self.single.image_layout.images_in(prefix.ids) == len(request.images)

    def _wake(self) -> None:
        with self._lock:
            self._wake_pending = False
            if self._worker is None and self._inbox:
                self._worker = threading.Thread(
                    target=self._work, name="wschat-generate-batch", daemon=True
                )
                self._worker.start()

    async def reachable(self) -> bool:
        return True

    async def aclose(self) -> None:
        worker = self._worker
        if worker is not None:
            await asyncio.to_thread(worker.join, 30)
        await self.single.aclose()

    # -- the worker thread ---------------------------------------------------------------

    def _work(self) -> None:
        with torch.inference_mode():
            while True:
                self._gather()
                with self._lock:
                    if self._inbox:
                        log.debug(
                            "%d prompts in, reaching the engine over %.1f ms (at most %.1f ms "
                            "apart); %d rows busy",
                            len(self._inbox),
                            (self._last_arrival - self._first_arrival) * 1000,
                            self._widest_gap * 1000,
                            self._rows,
                        )
                    self._waiting.extend(self._inbox)
                    self._inbox.clear()
                    if not (self._waiting or self._prefilling or self._decoding):
                        self._worker = None
                        return
                try:
                    self._pass()
                except BaseException as error:
                    log.exception(
                        "a batched pass failed; its %d rows end with an error", self._rows
                    )
                    self._fail_all(error)

    def _gather(self) -> None:
        """Wait while a burst of prompts is still arriving and rows are free for it."""
        cap_s = self.gather_cap_s if self._rows else self.idle_gather_cap_s
        while self._rows < self.width:
            with self._lock:
                if not self._inbox:
                    return
                arrivals, loop = self._arrivals, self._loop
                quiet_at = self._last_arrival + self.gather_s
                cap_at = self._first_arrival + cap_s
            now = time.monotonic()
            if now >= cap_at:
                return
            if now < quiet_at:
                time.sleep(min(quiet_at, cap_at) - now)
                continue
            if loop is None or not _turned(loop, SETTLE_TURNS, cap_at - now):
                return
            with self._lock:
                if self._arrivals == arrivals:
                    return

    @property
    def _rows(self) -> int:
        return len(self._decoding) + len(self._prefilling)

    def _pass(self) -> None:
        self.threads.apply()  # auto: follows what other processes leave free
        self._end_cancelled()
        self._admit()
        if self._prefilling:
            self._prefill_chunk()
            self._end_cancelled()
        if self._decoding:
            self._decode_step()

    def _admit(self) -> None:
        while self._waiting and self._rows < self.width:
            row = self._waiting.popleft()
            if row.prefix is not None and isinstance(row.prefix.cache, Cache):
                state = KVState.of_cache(row.prefix.cache, self._layout)
                row.prefix = CachedPrefix(state, row.prefix.ids, state.nbytes)
            if row.cancelled:
                row.finish(FinishReason.CANCELLED, row.prefix_state, self.kv)
                continue
            self._kv.add(row.prefix_state)  # the last row: the prefilling ones come last
            self._prefilling.append(row)

    def _end_cancelled(self) -> None:
        for b in reversed(range(len(self._decoding))):
            if self._decoding[b].cancelled:
                self._retire(self._decoding[b], FinishReason.CANCELLED)
        for j in reversed(range(len(self._prefilling))):
            if self._prefilling[j].cancelled:
                self._retire(self._prefilling[j], FinishReason.CANCELLED)

    def _prefill_chunk(self) -> None:
        rows = self._prefilling
        per_row = max(16, self.prefill_tokens // len(rows))
        counts = [min(row.unfed, per_row) for row in rows]
        width = max(counts)
        ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        for b, (row, n) in enumerate(zip(rows, counts, strict=True)):
            ids[b, :n] = torch.tensor(row.prompt_ids[row.fed : row.fed + n])
        hidden = self._forward(ids, counts, first=len(self._decoding))
        self.prefill_forwards += 1
        for row, n in zip(rows, counts, strict=True):
            row.fed += n
        done = [b for b, row in enumerate(rows) if row.unfed == 0]
        if not done:
            return
        last = torch.tensor([counts[b] - 1 for b in done])
        logits = self._logits(hidden[torch.tensor(done), last])
        picked = pick_tokens([rows[b].sampler for b in done], logits)
        for row, token in [(rows[b], token) for b, token in zip(done, picked, strict=True)]:
            reason = self._take(row, token)
            if reason is not None:
                self._retire(row, reason)
            else:
                self._start_decoding(self._prefilling.index(row))

    def _start_decoding(self, j: int) -> None:
        """The prefilling row ``j`` joins the decoding rows: first in line (a swap of two rows
        when it is not), then the boundary moves past it."""
        rows, d = self._prefilling, len(self._decoding)
        self._kv.swap(d, d + j)
        rows[0], rows[j] = rows[j], rows[0]
        self._decoding.append(rows.pop(0))

    def _decode_step(self) -> None:
        rows = self._decoding
        ids = torch.tensor([[row.next_token] for row in rows], dtype=torch.long)
        hidden = self._forward(ids, [1] * len(rows), first=0)
        picked = pick_tokens([row.sampler for row in rows], self._logits(hidden[:, -1]))
        self.decode_steps += 1
        self.decoded_tokens += len(rows)
        ended: list[tuple[BatchRow, FinishReason]] = []
        for row, token in zip(rows, picked, strict=True):
            reason = self._take(row, token)
            if reason is not None:
                ended.append((row, reason))
        for row, reason in ended:
            self._retire(row, reason)

    @staticmethod
    def _take(row: BatchRow, picked: int | Exception) -> FinishReason | None:
        """Stream the row's pick; the reason it ends now, if it does. A failure of the row's own
        work (its pick, its text) ends it alone: its batch mates never see it."""
        if row.cancelled:
            return FinishReason.CANCELLED
        if isinstance(picked, Exception):
            row.error = picked
        else:
            try:
                return row.take(picked)
            except Exception as error:
                row.error = error
        log.error("a row of the batch failed; it ends alone", exc_info=row.error)
        return FinishReason.ERROR

    def _forward(self, ids: torch.Tensor, counts: list[int], first: int) -> torch.Tensor:
        """One forward over the rows from ``first`` on, ``counts[b]`` tokens of ``ids[b]``."""
        device = self.model.device
        positions, masks = self._kv.plan(counts, first)
        out = self._text(
            input_ids=ids.to(device),
            attention_mask=masks,
            position_ids=positions,
            cache=self._kv,
            use_cache=True,
        )
        self._kv.advance()
        hidden: torch.Tensor = out.last_hidden_state
        return hidden

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self._lm_head(hidden)
        if self._softcap is not None:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits.float()

    def _retire(self, row: BatchRow, reason: FinishReason) -> None:
        """End ``row`` (decoding or prefilling), keeping its KV state unless it failed, and free
        its row of the buffers."""
        decoding = row in self._decoding
        b = (
            self._decoding.index(row)
            if decoding
            else len(self._decoding) + self._prefilling.index(row)
        )
        try:
            state = None if reason is FinishReason.ERROR else self._kv.save(b)
            row.finish(reason, state, self.kv, row.error)
        except Exception as error:
            log.exception("ending a row failed; it ends alone")
            row.finish(FinishReason.ERROR, None, self.kv, error)  # its done, unless already sent
        finally:
            if decoding:
                self._drop_decoding(b)
            else:
                self._drop_prefilling(b - len(self._decoding))

    def _drop_decoding(self, b: int) -> None:
        """Free decoding row ``b``: the last decoding row moves into it, and the last prefilling
        row into the place that leaves, so both runs of rows stay contiguous."""
        kv, rows = self._kv, self._decoding
        last = len(rows) - 1
        if b != last:
            kv.transfer(kv, last, b)
        rows[b] = rows[last]
        rows.pop()
        if self._prefilling:
            kv.transfer(kv, kv.count - 1, last)
            self._prefilling.insert(0, self._prefilling.pop())
        kv.remove(kv.count - 1)

    def _drop_prefilling(self, j: int) -> None:
        """Free prefilling row ``j``: ``SlotKV.remove`` moves the last row (the last prefilling
        one) into it; the list does the same."""
        self._kv.remove(len(self._decoding) + j)
        rows = self._prefilling
        rows[j] = rows[-1]
        rows.pop()

    def _fail_all(self, error: BaseException) -> None:
        for row in [*self._decoding, *self._prefilling]:
            try:
                row.finish(FinishReason.ERROR, None, self.kv, error)
            except Exception:
                log.exception("ending a failed row")
        self._decoding.clear()
        self._prefilling.clear()
        self._kv.clear()


def _turned(loop: asyncio.AbstractEventLoop, turns: int, timeout_s: float) -> bool:
    """Whether ``loop`` ran ``turns`` iterations within ``timeout_s`` (from another thread):
    each iteration polls its sockets, so a frame it had read moves on towards the engine."""
    done = threading.Event()

    def turn(left: int) -> None:
        if left > 0:
            loop.call_soon(turn, left - 1)
        else:
            done.set()

    try:
        loop.call_soon_threadsafe(turn, turns - 1)
    except RuntimeError:  # closed
        return False
    return done.wait(timeout_s)
