"""``OutputProcessor``: a batch row's picked tokens to its client.

A step's picks (``steps.StepResult``) go each through its row's ``TokenStreamer`` (detokenized
pieces, stop strings) to its ``LoopBridge``; the pick that ends the row says why
(``stopping.finish_reason``), and the row's end delivers its one ``Finished`` after leaving its
KV state in the ``KVStore`` (so the session's next prompt finds it), and makes it FINISHED. A
failure of the row's own work (its pick, its text, its finish) ends that row alone with an
error: its batch mates never see it.
"""

from __future__ import annotations

import logging

from wschat.protocol import FinishReason

from ..base import Finished
from ..stopping import finish_reason
from .kvstore import KVStore, cached_prefix
from .rows import BatchRow
from .scheduler import RowState
from .sequence_kv import KVState
from .steps import RowEnd, StepPlan, StepResult

log = logging.getLogger("wschat.engine.batched")


class OutputProcessor:
    def __init__(self, store: KVStore) -> None:
        self.store = store

    def update(
        self, plan: StepPlan[BatchRow], result: StepResult
    ) -> list[tuple[BatchRow, RowEnd | None]]:
        """Stream each pick of a step; each picking row, in order, with why it ends now, if it
        does."""
        rows = plan.picking
        return [(row, self.take(row, p)) for row, p in zip(rows, result.picked, strict=True)]

    def take(self, row: BatchRow, picked: int | Exception) -> RowEnd | None:
        """Stream the row's pick; why it ends now, if it does (its error, where it failed)."""
        if row.cancelled:  # cancel flags are read before a token is streamed
            return RowEnd(FinishReason.CANCELLED)
        error: Exception
        if isinstance(picked, Exception):
            error = picked
        else:
            try:
                reason = self.stream(row, picked)
            except Exception as failed:
                error = failed
            else:
                return None if reason is None else RowEnd(reason)
        log.error("a row of the batch failed; it ends alone", exc_info=error)
        return RowEnd(FinishReason.ERROR, error)

    def stream(self, row: BatchRow, token: int) -> FinishReason | None:
        """Stream a picked token; the reason the row ends with it, if it does."""
        row.sampler.observe(token)
        if row.grammar is not None:
            row.grammar.advance(token)
        row.streamer.push(token)
        return finish_reason(
            cancelled=False,
            stopped=token in row.end_ids or row.streamer.stop_string_hit,
            produced=len(row.streamer.generated),
            budget=row.max_new_tokens,
        )

    def finish(
        self,
        row: BatchRow,
        reason: FinishReason,
        state: KVState | None,
        error: BaseException | None = None,
    ) -> None:
        """Deliver the row's terminal item (once: it is FINISHED then), keeping ``state`` for
        its session's next turn."""
        if row.state is RowState.FINISHED:
            return
        row.state = RowState.FINISHED
        try:
            row.streamer.end()
            key = row.request.session_key
            if key and state is not None and state.length and reason is not FinishReason.ERROR:
                ids = [*row.request.prompt_ids, *row.streamer.generated][: state.length]
                self.store.put(key, cached_prefix(state, ids, state.tensors(), row.marks()))
        finally:
            row.bridge.put(Finished(reason, tuple(row.streamer.generated), error))

    def fail(self, rows: list[BatchRow], error: BaseException) -> None:
        """End every row of a failed pass with ``error``."""
        for row in rows:
            try:
                self.finish(row, FinishReason.ERROR, None, error)
            except Exception:
                log.exception("ending a failed row")
