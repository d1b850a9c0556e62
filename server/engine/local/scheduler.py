"""``Scheduler``: which rows of the batched engine run in each pass, and where their KV lives.

It holds no tensor and imports no torch (tests run it alone): it admits generations in the order
they came, at most ``width`` at once, gathers the prompts of a burst so they start together,
plans each forward (``steps.StepPlan``: a prefill chunk, sized so the decoding rows never wait
long, or a decode step), and keeps the slot layout that the KV buffers follow. Each row is in one
``RowState``, as a slot of llama.cpp's server is:

    WAITING -> PREFILLING -> DECODING -> FINISHED
       |            |_______________________^
       |____________________________________^  (cancelled while it waited)

The scheduler moves a row up to DECODING; FINISHED is the output's (``output.py``), set once when
the row's terminal item is delivered, whether or not the row still has a slot.

The slots are one list in the order of the KV buffers' rows: the decoding rows first, then the
prefilling ones, so each forward runs over one contiguous run of rows. A row whose prompt is done
joins the decoding rows where it is (a swap of two rows when a prompt ahead of it still
prefills), and a row that leaves has the last row of its run moved into its place; every such
move is made on the ``SlotRows`` (the KV buffers) in the same call, so the two never disagree.

Burst gathering: prompts that clients sent together reach the engine over some loop iterations
(one socket each), and a prefill started on the first of them makes the rest wait for its
forward and a decode step before their own: 8 prompts sent at once got their first tokens in
about 2x the static batch's time whenever the burst split. So new prompts are taken in once none
came for ``gather_s`` and none in the event loop's next ``SETTLE_TURNS`` iterations after that
(a loop held up, by a thread start or a collection, has frames it read and has not handed over
yet), never longer than ``GATHER_CAP_S`` from the first while rows decode (they wait for it) or
``IDLE_GATHER_CAP_S`` while none does.
"""

from __future__ import annotations

import asyncio
import enum
import threading
import time
from collections import deque
from typing import Generic, Protocol, TypeVar

from .steps import StepKind, StepPlan

# A burst of prompts is admitted once none came for GATHER_S and the event loop then turned
# SETTLE_TURNS times without one: a frame takes a few turns from its socket to the engine, and
# when a batch ends the loop hands its freed slots to queued sessions a few at a time. At most
# GATHER_CAP_S after the first arrived while other rows decode, IDLE_GATHER_CAP_S while none does:
# a burst split in two costs its second half a whole prefill and decode step, far more than the
# wait. (bench/arrivals.py measures bursts and staggered arrivals.)
GATHER_S = 0.002
SETTLE_TURNS = 16
GATHER_CAP_S = 0.010
IDLE_GATHER_CAP_S = 0.050
# A prefill chunk gives each prefilling row at least this many tokens, however many share it.
MIN_CHUNK_TOKENS = 16


class RowState(enum.Enum):
    WAITING = "waiting"  # submitted, no slot yet
    PREFILLING = "prefilling"  # in a slot, feeding its prompt
    DECODING = "decoding"  # in a slot, one token a step
    FINISHED = "finished"  # its terminal item is delivered (the output's)


class Row(Protocol):
    """What the scheduler reads and writes of a row (``rows.BatchRow``)."""

    state: RowState
    fed: int  # prompt tokens whose KV state the row holds

    @property
    def prompt_ids(self) -> list[int]: ...

    @property
    def last_token(self) -> int:
        """The token it picked last: what it feeds in the next decode step."""

    @property
    def unfed(self) -> int: ...

    @property
    def cancelled(self) -> bool: ...


R = TypeVar("R", bound=Row)
R_in = TypeVar("R_in", bound=Row, contravariant=True)


class SlotRows(Protocol[R_in]):
    """The KV buffers' rows as the scheduler moves them (the model runner's)."""

    def add(self, row: R_in) -> None:
        """Occupy the next buffer row with ``row``'s cached state."""

    def move(self, src: int, dst: int) -> None:
        """Copy buffer row ``src`` into ``dst``."""

    def swap(self, a: int, b: int) -> None: ...

    def remove(self, slot: int) -> None:
        """Free ``slot``; the last occupied row moves into it."""

    def clear(self) -> None: ...


class Scheduler(Generic[R]):
    def __init__(
        self,
        slots: SlotRows[R],
        width: int,
        *,
        prefill_tokens: int = 512,
        gather_s: float = GATHER_S,
    ) -> None:
        self._kv = slots
        self.width = width
        self.prefill_tokens = prefill_tokens
        self.gather_s = gather_s
        self.gather_cap_s = max(gather_s, GATHER_CAP_S)
        self.idle_gather_cap_s = max(gather_s, IDLE_GATHER_CAP_S)
        # the worker thread's alone (like the buffers): slot i is buffer row i
        self.slots: list[R] = []
        self.decoding_count = 0  # slots [0, decoding_count) decode, the rest prefill
        self.waiting: deque[R] = deque()  # taken in from the inbox, no slot yet
        # guards the inbox, its arrival times and whether a worker runs: submit() runs on the
        # loop, the worker drains the inbox and says when it exits
        self._lock = threading.Lock()
        self._inbox: list[R] = []
        self._first_arrival = 0.0  # when the oldest row of the inbox came (time.monotonic)
        self._last_arrival = 0.0  # when the newest did
        self.widest_gap = 0.0  # the longest wait between two of them (logged, to tune gather_s)
        self._arrivals = 0  # rows ever put in the inbox: the gather sees whether more came
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop submit() runs on
        self._working = False  # a worker runs, or is about to start
        self._wake_pending = False

    # -- the event loop's side -----------------------------------------------------------

    def submit(self, row: R, loop: asyncio.AbstractEventLoop) -> bool:
        """A new row (WAITING); whether the worker must be woken for it."""
        row.state = RowState.WAITING
        with self._lock:
            now = time.monotonic()
            if self._inbox:
                self.widest_gap = max(self.widest_gap, now - self._last_arrival)
            else:
                self._first_arrival, self.widest_gap = now, 0.0
            self._last_arrival = now
            self._inbox.append(row)
            self._arrivals += 1
            self._loop = loop
            wake = not self._working and not self._wake_pending
            self._wake_pending = self._wake_pending or wake
        return wake

    def start_worker(self) -> bool:
        """The wake-up came: whether a worker is to start now (none runs, work waits)."""
        with self._lock:
            self._wake_pending = False
            start = not self._working and bool(self._inbox)
            self._working = self._working or start
        return start

    # -- the worker's side ---------------------------------------------------------------

    @property
    def rows(self) -> int:
        return len(self.slots)

    @property
    def decoding(self) -> list[R]:
        return self.slots[: self.decoding_count]

    @property
    def prefilling(self) -> list[R]:
        return self.slots[self.decoding_count :]

    def gather(self) -> None:
        """Wait while a burst of prompts is still arriving and rows are free for it."""
        cap_s = self.gather_cap_s if self.slots else self.idle_gather_cap_s
        while len(self.slots) < self.width:
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
            if loop is None or not turned(loop, SETTLE_TURNS, cap_at - now):
                return
            with self._lock:
                if self._arrivals == arrivals:
                    return

    def take_arrivals(self) -> tuple[int, float]:
        """Move the inbox to the waiting rows: how many came and over how long (seconds)."""
        with self._lock:
            came = len(self._inbox)
            spread = self._last_arrival - self._first_arrival if came else 0.0
            self.waiting.extend(self._inbox)
            self._inbox.clear()
        return came, spread

    def worker_done(self) -> bool:
        """Whether the worker has nothing left and exits (a later submit wakes a new one)."""
        with self._lock:
            if self._inbox or self.waiting or self.slots:
                return False
            self._working = False
            return True

    def admit(self) -> list[R]:
        """Waiting rows in the order they came, while a slot is free: each PREFILLING in the
        last slot. Returns the rows cancelled while they waited (no slot, to be finished)."""
        cancelled: list[R] = []
        while self.waiting and len(self.slots) < self.width:
            row = self.waiting.popleft()
            if row.cancelled:
                cancelled.append(row)
                continue
            self._kv.add(row)
            self.slots.append(row)
            row.state = RowState.PREFILLING
        return cancelled

    def chunk(self) -> list[int]:
        """Prompt tokens each prefilling row feeds in the next prefill forward: an equal share
        of ``prefill_tokens`` (so decoding rows never wait long), at least MIN_CHUNK_TOKENS."""
        rows = self.prefilling
        share = max(MIN_CHUNK_TOKENS, self.prefill_tokens // len(rows))
        return [min(row.unfed, share) for row in rows]

    def plan_prefill(self) -> StepPlan[R]:
        """The next prefill forward: each prefilling row feeds its next ``chunk()`` of prompt
        ids; those whose prompt it finishes pick their first token."""
        rows, counts = self.prefilling, self.chunk()
        inputs = tuple(
            tuple(row.prompt_ids[row.fed : row.fed + n])
            for row, n in zip(rows, counts, strict=True)
        )
        done = tuple(
            j for j, (row, n) in enumerate(zip(rows, counts, strict=True)) if row.unfed == n
        )
        return StepPlan(StepKind.PREFILL, tuple(rows), self.decoding_count, inputs, done)

    def plan_first(self) -> StepPlan[R]:
        """The prefilling rows whose prompt is fed already, those admitted with a sibling's
        state (``siblings.py``): each picks its first token, with no forward."""
        rows = tuple(row for row in self.prefilling if not row.unfed)
        inputs = tuple(() for _ in rows)
        return StepPlan(StepKind.FIRST, rows, self.decoding_count, inputs, tuple(range(len(rows))))

    def plan_decode(self) -> StepPlan[R]:
        """The next decode step: every decoding row feeds its last token and picks the next."""
        rows = tuple(self.decoding)
        inputs = tuple((row.last_token,) for row in rows)
        return StepPlan(StepKind.DECODE, rows, 0, inputs, tuple(range(len(rows))))

    def ran(self, plan: StepPlan[R]) -> None:
        """``plan``'s forward ran: its prefilling rows hold the KV state of what they fed."""
        if plan.kind is StepKind.PREFILL:
            for row, ids in zip(plan.rows, plan.inputs, strict=True):
                row.fed += len(ids)

    def start_decoding(self, row: R) -> None:
        """A PREFILLING row joins the decoding rows: first in line of the prefilling ones (a
        swap of two rows when it is not), then the boundary moves past it."""
        d, s = self.decoding_count, self.slot_of(row)
        self._kv.swap(d, s)
        self.slots[d], self.slots[s] = self.slots[s], self.slots[d]
        self.decoding_count += 1
        row.state = RowState.DECODING

    def slot_of(self, row: R) -> int:
        return self.slots.index(row)

    def cancelled(self, state: RowState) -> list[R]:
        """The cancelled rows in ``state``, last slot first (the order ``retire`` keeps the
        others' slots in)."""
        run = self.decoding if state is RowState.DECODING else self.prefilling
        return [row for row in reversed(run) if row.cancelled]

    def retire(self, row: R) -> None:
        """Free ``row``'s slot: the last row of its run moves into it, and for a decoding row
        the last prefilling one into the place that leaves, so both runs of rows stay
        contiguous."""
        s, slots, kv = self.slot_of(row), self.slots, self._kv
        if s < self.decoding_count:
            last = self.decoding_count - 1
            if s != last:
                kv.move(last, s)
            slots[s] = slots[last]
            if len(slots) > self.decoding_count:
                kv.move(len(slots) - 1, last)
                slots[last] = slots[-1]
            self.decoding_count -= 1
            s = len(slots) - 1
        kv.remove(s)  # the last row moves into s, in the buffers and here
        slots[s] = slots[-1]
        slots.pop()

    def clear(self) -> list[R]:
        """Every row in a slot leaves at once (to be finished); they are returned."""
        rows, self.slots, self.decoding_count = self.slots, [], 0
        self._kv.clear()
        return rows


def turned(loop: asyncio.AbstractEventLoop, turns: int, timeout_s: float) -> bool:
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
