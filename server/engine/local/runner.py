"""``ModelRunner``: the batched engine's torch side, its forward passes and their tokens.

It owns the text decoder, the LM head and the one ``SlotKV`` every row of the batch lives in:
it runs the forward a ``steps.StepPlan`` says, a prefill chunk or a decode step over a
contiguous run of rows (each row at its own position), turns the last hidden states into
float32 logits (Gemma's final soft-capping included) and picks each picking row's token
(``pick``): a ``StepResult``. It moves
KV rows only when the scheduler says so (``scheduler.SlotRows``), and takes a ``generate``
path's transformers ``Cache`` over as a ``KVState`` when its row is admitted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import Cache

from . import attention
from .grammar_mask import RowMasks
from .kvstore import cached_prefix
from .loader import LoadedModel
from .logprobs import observe
from .rows import BatchRow
from .sampling import pick_tokens
from .sequence_kv import KVState, LayerLayout, ring_of_cache
from .slotkv import SlotKV
from .steps import StepKind, StepPlan, StepResult


class ModelRunner:
    def __init__(self, loaded: LoadedModel, layout: LayerLayout, width: int) -> None:
        self.model = loaded.model
        inner = self.model.model
        self._text = getattr(inner, "language_model", inner)  # the decoder stack, text only
        self.lm_head = self.model.lm_head
        text_config = getattr(self.model.config, "text_config", self.model.config)
        self._softcap = getattr(text_config, "final_logit_softcapping", None)
        self._pad_id = int(loaded.tokenizer.pad_token_id or 0)
        self.layout = layout
        # One set of buffers: the decoding rows first, then the prefilling ones, so a row whose
        # prompt is done starts decoding where it is (no copy of its cache) and the rows of a
        # width need one row of KV buffers each (worker thread only, like the scheduler's slots)
        # Forwards attend without masks where a kernel for ragged rows is there (attention.py);
        # generate's forwards keep the attention function the model was loaded with
        attention.install(text_config)
        kernel = attention.choose_kernel(self.model.device, loaded.dtype)
        self.kv = SlotKV(self.layout, width, kernel=kernel)
        self.masks = RowMasks(int(self.lm_head.out_features))

    # -- the slots, as the scheduler moves them (``SlotRows``) ---------------------------

    def add(self, row: BatchRow) -> None:
        self.adopt(row)
        self.kv.add(row.prefix_state)  # the last row: the prefilling ones come last

    def move(self, src: int, dst: int) -> None:
        self.kv.transfer(self.kv, src, dst)

    def swap(self, a: int, b: int) -> None:
        self.kv.swap(a, b)

    def remove(self, slot: int) -> None:
        self.kv.remove(slot)

    def clear(self) -> None:
        self.kv.clear()

    def release(self) -> None:
        """New buffers of the first size for the next pass (after one failed: what it left in
        the old ones, grown or part-written, is unknown), and the old ones' memory freed."""
        old = self.kv
        self.kv = SlotKV(self.layout, old.rows, kernel=old.kernel)

    def save(self, slot: int) -> KVState:
        return self.kv.save(slot)

    def adopt(self, row: BatchRow) -> None:
        """A ``generate`` path's cache the row starts from, in the batch's form."""
        prefix = row.prefix
        if prefix is not None and isinstance(prefix.cache, Cache):
            state = KVState.of_cache(prefix.cache, self.layout)
            marks = [ring_of_cache(m, self.layout.window) for m in prefix.marks]
            row.prefix = cached_prefix(state, prefix.ids, state.tensors(), marks)

    # -- passes ----------------------------------------------------------------------------

    def execute(self, plan: StepPlan[BatchRow]) -> StepResult:
        """Run ``plan``'s forward over its rows and pick the tokens of its picking rows, each
        from the hidden state of the last id it fed (a ``FIRST`` plan: from its sibling's
        logits, no forward)."""
        if plan.kind is StepKind.FIRST:
            logits = torch.stack([row.take_first_logits() for row in plan.rows])
            return StepResult(tuple(self.pick(plan.rows, logits)))
        counts = plan.counts
        width = max(counts)
        padded = [[*ids, *[self._pad_id] * (width - len(ids))] for ids in plan.inputs]
        hidden = self.forward(torch.tensor(padded, dtype=torch.long), counts, plan.first)
        if plan.kind is StepKind.DECODE:  # every row picks, from its one id
            return StepResult(tuple(self.pick(plan.rows, self.logits(hidden[:, -1]))))
        if not plan.picks:
            return StepResult(())
        picks = list(plan.picks)
        logits = self.logits(
            hidden[torch.tensor(picks), torch.tensor([counts[j] - 1 for j in picks])]
        )
        leaders = {j: logits[k].clone() for k, j in enumerate(picks) if plan.rows[j].followers}
        return StepResult(tuple(self.pick(plan.picking, logits)), leaders)

    def pick(self, rows: Sequence[BatchRow], logits: torch.Tensor) -> list[int | Exception]:
        """Each row's token from its row of ``logits``: its logprobs read first (the rows that
        asked), then its grammar's mask applied (the constrained rows), then its own sampler; a
        row whose mask or pick fails gets the exception in its place."""
        recording = [j for j, row in enumerate(rows) if row.logprobs is not None]
        if recording:
            read = logits if len(recording) == len(rows) else logits[torch.tensor(recording)]
            observe([recorder for row in rows if (recorder := row.logprobs) is not None], read)
        failed = self.masks.apply(logits, [row.grammar for row in rows])
        picked = pick_tokens([row.sampler for row in rows], logits)
        for j, error in failed.items():
            picked[j] = error
        return picked

    def forward(self, ids: torch.Tensor, counts: list[int], first: int) -> torch.Tensor:
        """One forward over the rows from ``first`` on, ``counts[b]`` tokens of ``ids[b]``."""
        device = self.model.device
        positions, masks = self.kv.plan(counts, first)
        out = self._text(
            input_ids=ids.to(device),
            attention_mask=masks,
            position_ids=positions,
            cache=self.kv,
            use_cache=True,
            **self.kv.attention_kwargs(),
        )
        self.kv.advance()
        hidden: torch.Tensor = out.last_hidden_state
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm_head(hidden)
        if self._softcap is not None:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits.float()
