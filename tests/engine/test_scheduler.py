"""``Scheduler`` alone, with plain rows and a buffer stand-in that records which row's KV each
buffer row holds: admission order, the width, burst gathering, cancelled and retired rows, and
each row's state through its prefill and decode. No torch: the scheduler imports none."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import pytest
from wschat.server.engine.local.scheduler import GATHER_S, RowState, Scheduler
from wschat.server.engine.local.steps import StepKind

from tests.support import modules_loaded_by

TIMEOUT = 10.0


@dataclass(eq=False)
class Row:
    name: str
    prompt: int  # prompt tokens
    fed: int = 0
    cancelled: bool = False
    state: RowState = field(default=RowState.WAITING, init=False)

    @property
    def prompt_ids(self) -> list[int]:
        return list(range(100, 100 + self.prompt))

    @property
    def last_token(self) -> int:
        return 7

    @property
    def unfed(self) -> int:
        return self.prompt - self.fed


class Buffers:
    """The KV buffers' rows: which row's state each holds, moved as the scheduler says."""

    def __init__(self) -> None:
        self.held: list[str] = []

    def add(self, row: Row) -> None:
        self.held.append(row.name)

    def move(self, src: int, dst: int) -> None:
        self.held[dst] = self.held[src]

    def swap(self, a: int, b: int) -> None:
        self.held[a], self.held[b] = self.held[b], self.held[a]

    def remove(self, slot: int) -> None:
        self.held[slot] = self.held[-1]
        self.held.pop()

    def clear(self) -> None:
        self.held.clear()


def scheduler(
    width: int = 4, *, prefill_tokens: int = 512, gather_s: float = GATHER_S
) -> tuple[Scheduler[Row], Buffers]:
    buffers = Buffers()
    made = Scheduler(buffers, width, prefill_tokens=prefill_tokens, gather_s=gather_s)
    return made, buffers


def names(rows: list[Row]) -> list[str]:
    return [row.name for row in rows]


def follows(s: Scheduler[Row], buffers: Buffers) -> bool:
    return buffers.held == names(s.slots)


async def submitted(s: Scheduler[Row], *rows: Row) -> None:
    loop = asyncio.get_running_loop()
    for row in rows:
        s.submit(row, loop)
    s.take_arrivals()


def test_importing_the_scheduler_loads_no_torch() -> None:
    loaded = modules_loaded_by("import wschat.server.engine.local.scheduler")
    assert "wschat.server.engine.local.scheduler" in loaded  # the probe really imported it
    heavy = {name.partition(".")[0] for name in loaded} & {"torch", "numpy", "transformers"}
    assert heavy == set()


async def test_rows_are_admitted_in_arrival_order_up_to_the_width() -> None:
    s, buffers = scheduler(width=3)
    rows = [Row(f"r{i}", 10) for i in range(5)]
    await submitted(s, *rows)
    assert [row.state for row in rows] == [RowState.WAITING] * 5
    assert s.admit() == []
    assert names(s.slots) == ["r0", "r1", "r2"] and names(list(s.waiting)) == ["r3", "r4"]
    assert [row.state for row in rows] == [RowState.PREFILLING] * 3 + [RowState.WAITING] * 2
    assert follows(s, buffers)
    s.admit()  # no slot free: nothing moves
    assert names(s.slots) == ["r0", "r1", "r2"] and len(s.waiting) == 2


async def test_a_row_cancelled_while_waiting_is_handed_back_without_a_slot() -> None:
    s, buffers = scheduler(width=2)
    first, cancelled, third = Row("a", 5), Row("b", 5, cancelled=True), Row("c", 5)
    await submitted(s, first, cancelled, third)
    assert s.admit() == [cancelled]
    assert cancelled.state is RowState.WAITING  # the output finishes it
    assert names(s.slots) == ["a", "c"] and follows(s, buffers)


async def test_a_row_goes_from_waiting_through_prefill_plans_to_decode_steps() -> None:
    s, buffers = scheduler(width=2, prefill_tokens=32)
    row = Row("a", 40)
    await submitted(s, row)
    s.admit()
    assert row.state is RowState.PREFILLING
    first = s.plan_prefill()
    assert (first.kind, first.rows, first.first) == (StepKind.PREFILL, (row,), 0)
    assert first.inputs == (tuple(range(100, 132)),) and first.picks == ()
    s.ran(first)
    assert row.unfed == 8
    last = s.plan_prefill()
    assert last.inputs == (tuple(range(132, 140)),) and last.picks == (0,)
    s.ran(last)
    assert row.unfed == 0
    s.start_decoding(row)
    assert row.state is RowState.DECODING and s.decoding == [row] and s.prefilling == []
    step = s.plan_decode()
    assert (step.kind, step.rows, step.inputs, step.picks) == (
        StepKind.DECODE,
        (row,),
        ((7,),),
        (0,),
    )
    s.ran(step)
    assert row.fed == 40  # a decode step feeds no prompt
    s.retire(row)
    assert s.slots == [] and buffers.held == []


async def test_prefill_chunks_share_the_tokens_and_give_each_row_at_least_sixteen() -> None:
    s, _ = scheduler(width=4, prefill_tokens=40)
    rows = [Row("a", 100), Row("b", 5), Row("c", 100)]
    await submitted(s, *rows)
    s.admit()
    assert s.chunk() == [16, 5, 16]  # 40 // 3 is 13, below the floor
    s.prefill_tokens = 90
    assert s.chunk() == [30, 5, 30]


async def test_a_prompt_done_behind_one_still_prefilling_swaps_ahead_of_it() -> None:
    s, buffers = scheduler(width=4, prefill_tokens=32)
    long, short = Row("long", 100), Row("short", 4)
    await submitted(s, long, short)
    s.admit()
    plan = s.plan_prefill()
    s.ran(plan)
    assert plan.picks == (1,) and plan.picking == [short]
    s.start_decoding(short)
    assert names(s.decoding) == ["short"] and names(s.prefilling) == ["long"]
    assert follows(s, buffers)


async def test_rows_admitted_with_their_prompt_fed_are_planned_a_pick_without_a_forward() -> None:
    """Siblings start from a copy of the state their prompt was fed into (siblings.py): the
    plan has them pick their first token, feeding nothing; the others prefill after."""
    s, _ = scheduler(width=4, prefill_tokens=32)
    sibling, other, twin = Row("sibling", 10, fed=10), Row("other", 10), Row("twin", 10, fed=10)
    await submitted(s, sibling, other, twin)
    s.admit()
    first = s.plan_first()
    assert (first.kind, first.rows, first.inputs, first.picks) == (
        StepKind.FIRST,
        (sibling, twin),
        ((), ()),
        (0, 1),
    )
    s.ran(first)
    assert (sibling.fed, twin.fed) == (10, 10)
    for row in first.picking:
        s.start_decoding(row)
    assert names(s.decoding) == ["sibling", "twin"] and names(s.prefilling) == ["other"]
    assert s.plan_first().rows == () and s.plan_prefill().rows == (other,)


async def three_decoding_two_prefilling() -> tuple[Scheduler[Row], Buffers, list[Row]]:
    """Rows a, b, c decoding in slots 0-2; p and q prefilling in 3 and 4."""
    s, buffers = scheduler(width=5)
    rows = [Row(name, 1) for name in "abc"] + [Row("p", 100), Row("q", 100)]
    await submitted(s, *rows)
    s.admit()
    s.ran(s.plan_prefill())
    for row in rows[:3]:
        s.start_decoding(row)
    return s, buffers, rows


async def test_retiring_keeps_the_decoding_and_prefilling_runs_contiguous() -> None:
    s, buffers, rows = await three_decoding_two_prefilling()
    assert names(s.decoding) == ["a", "b", "c"] and names(s.prefilling) == ["p", "q"]
    s.retire(rows[0])  # the last decoding row takes its place, the last prefilling one c's
    assert names(s.decoding) == ["c", "b"] and names(s.prefilling) == ["q", "p"]
    assert follows(s, buffers)
    s.retire(rows[3])  # a prefilling row: the last row takes its place
    assert names(s.decoding) == ["c", "b"] and names(s.prefilling) == ["q"]
    assert follows(s, buffers)


async def test_cancelled_rows_are_listed_by_state_last_slot_first() -> None:
    s, _, rows = await three_decoding_two_prefilling()
    for row in (rows[0], rows[2], rows[3], rows[4]):
        row.cancelled = True
    assert names(s.cancelled(RowState.DECODING)) == ["c", "a"]
    assert names(s.cancelled(RowState.PREFILLING)) == ["q", "p"]


async def test_clearing_empties_every_slot_and_keeps_the_waiting_ones() -> None:
    s, buffers = scheduler(width=2)
    rows = [Row(name, 3) for name in "abc"]
    await submitted(s, *rows)
    s.admit()
    assert names(s.clear()) == ["a", "b"]
    assert s.slots == [] and buffers.held == [] and names(list(s.waiting)) == ["c"]


async def test_one_worker_is_woken_and_it_exits_only_when_no_work_is_left() -> None:
    s, _ = scheduler(width=2)
    loop = asyncio.get_running_loop()
    row = Row("a", 3)
    assert s.submit(row, loop) is True  # wake a worker
    assert s.submit(Row("b", 3), loop) is False  # a wake is already due
    assert s.start_worker() is True and s.start_worker() is False
    assert s.submit(Row("c", 3), loop) is False  # the worker runs
    assert s.worker_done() is False  # its inbox is not taken in yet
    s.take_arrivals()
    s.admit()
    assert s.worker_done() is False
    for slot in list(s.slots):
        s.retire(slot)
    s.admit()
    s.retire(s.slots[0])
    assert s.worker_done() is True
    assert s.submit(Row("d", 3), loop) is True  # the next row wakes a new one


async def gather_in_thread(s: Scheduler[Row]) -> asyncio.Future[None]:
    future = asyncio.ensure_future(asyncio.to_thread(s.gather))
    await asyncio.sleep(0)  # the thread starts
    return future


async def test_prompts_arriving_apart_within_the_quiet_gap_are_taken_in_together() -> None:
    s, _ = scheduler(width=4, gather_s=0.5)
    s.idle_gather_cap_s = TIMEOUT  # the quiet gap decides, not the cap
    loop = asyncio.get_running_loop()
    s.submit(Row("a", 3), loop)
    gathering = await gather_in_thread(s)
    await asyncio.sleep(0.05)  # the next client's prompt, a little later
    assert not gathering.done()
    s.submit(Row("b", 3), loop)
    await asyncio.wait_for(gathering, TIMEOUT)
    came, _ = s.take_arrivals()
    assert came == 2


async def test_a_burst_stays_whole_while_the_event_loop_is_held_up() -> None:
    # The loop blocked far past the quiet gap after the first prompt (a thread start, a
    # collection), with the second frame already read: the gather waits for the loop to turn.
    s, _ = scheduler(width=4)
    s.idle_gather_cap_s = TIMEOUT
    loop = asyncio.get_running_loop()
    s.submit(Row("a", 3), loop)
    gathering = await gather_in_thread(s)
    time.sleep(20 * s.gather_s)
    s.submit(Row("b", 3), loop)
    await asyncio.wait_for(gathering, TIMEOUT)
    came, _ = s.take_arrivals()
    assert came == 2


async def test_no_gather_while_every_slot_is_taken() -> None:
    s, _ = scheduler(width=1, gather_s=TIMEOUT)
    s.gather_cap_s = s.idle_gather_cap_s = TIMEOUT
    await submitted(s, Row("a", 3))
    s.admit()
    s.submit(Row("b", 3), asyncio.get_running_loop())
    await asyncio.wait_for(asyncio.to_thread(s.gather), TIMEOUT / 2)  # at once, not after


@pytest.mark.parametrize("cap", ["busy", "idle"])
async def test_a_gather_ends_at_its_cap_however_long_the_burst(cap: str) -> None:
    s, _ = scheduler(width=4, gather_s=TIMEOUT)
    s.gather_cap_s, s.idle_gather_cap_s = (0.05, TIMEOUT) if cap == "busy" else (TIMEOUT, 0.05)
    if cap == "busy":  # a row decodes: the busy cap applies
        await submitted(s, Row("a", 1))
        s.admit()
    s.submit(Row("b", 3), asyncio.get_running_loop())
    await asyncio.wait_for(asyncio.to_thread(s.gather), TIMEOUT / 2)
