"""What one step of the batched engine hands along, as data: the ``Scheduler`` plans a forward
(``StepPlan``), the ``ModelRunner`` runs it and returns its picks (``StepResult``), and the
``OutputProcessor`` streams them and says which rows end, ``RowEnd`` (vLLM's engine core hands a
``SchedulerOutput`` to its runner and a ``ModelRunnerOutput`` back the same way). No torch:
the ids are ints until the runner makes its input tensor, and again from its picks on.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from wschat.protocol import FinishReason

if TYPE_CHECKING:
    import torch

R = TypeVar("R")


class StepKind(enum.Enum):
    PREFILL = "prefill"  # the prefilling rows feed a chunk of their prompts
    DECODE = "decode"  # the decoding rows feed their last token each
    # the rows that start from a sibling's fed prompt (siblings.py) pick their first token from
    # the logits of its last prompt token: no forward, no ids fed
    FIRST = "first"


@dataclass(frozen=True, slots=True)
class StepPlan(Generic[R]):
    """One forward over a contiguous run of rows, slots ``first`` on: the ids each row feeds,
    and which of the rows pick a token after it (places in ``rows``): the rows whose prompt it
    finishes, or every decoding row. A ``FIRST`` plan runs no forward: each of its rows picks,
    from its sibling's logits, and feeds nothing."""

    kind: StepKind
    rows: tuple[R, ...]
    first: int
    inputs: tuple[tuple[int, ...], ...]
    picks: tuple[int, ...]

    @property
    def counts(self) -> list[int]:
        """The ids each row feeds."""
        return [len(ids) for ids in self.inputs]

    @property
    def picking(self) -> list[R]:
        return [self.rows[j] for j in self.picks]


@dataclass(frozen=True, slots=True)
class StepResult:
    """A plan, run: the token each of its picking rows took, in order, or the
    exception its mask or sampler raised (that row fails alone); and, by place in the plan's
    rows, the logits of the prefilled rows that siblings wait for (``siblings.py``), as the
    model gave them."""

    picked: tuple[int | Exception, ...]
    leaders: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RowEnd:
    """Why a row ends (the output's answer to its pick, or a failed forward's): the reason, and
    the error where it failed, which its ``Finished`` carries."""

    reason: FinishReason
    error: BaseException | None = None
