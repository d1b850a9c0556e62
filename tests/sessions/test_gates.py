"""``Gate``: at most ``limit`` turns at once, the rest served in arrival order, and a worker
thread's turn held until the thread ends, whoever stopped waiting for it."""

from __future__ import annotations

import asyncio
import threading

import pytest
from wschat.server.sessions.gates import Gate

from tests.support import TIMEOUT, wait_until


async def test_callers_past_the_limit_wait_and_are_served_in_arrival_order() -> None:
    gate, order = Gate(2), list[int]()
    await gate.acquire()
    await gate.acquire()
    assert not gate.free

    async def caller(n: int) -> None:
        await gate.acquire()
        order.append(n)

    callers = [asyncio.create_task(caller(n)) for n in range(3)]
    await wait_until(lambda: gate.waiting == 3)
    assert (gate.running, order) == (2, [])
    for served in (1, 2, 3):
        gate.release()  # one turn freed: the earliest waiter takes it
        await wait_until(lambda served=served: len(order) == served)
    async with asyncio.timeout(TIMEOUT):
        await asyncio.gather(*callers)
    assert order == [0, 1, 2] and (gate.running, gate.waiting, gate.peak) == (2, 0, 2)


async def test_a_caller_cancelled_while_it_waits_holds_no_turn() -> None:
    gate = Gate(1)
    await gate.acquire()
    waiter = asyncio.create_task(gate.acquire())
    await wait_until(lambda: gate.waiting == 1)
    waiter.cancel()
    await asyncio.wait({waiter}, timeout=TIMEOUT)
    gate.release()
    assert (gate.running, gate.waiting, gate.free) == (0, 0, True)


async def test_a_threads_turn_ends_with_the_thread_not_with_its_cancelled_caller() -> None:
    gate, release = Gate(1), threading.Event()  # set by the test: the thread's work ends
    caller = asyncio.create_task(gate.thread(release.wait, TIMEOUT))
    await wait_until(lambda: gate.running == 1)
    caller.cancel()
    await asyncio.wait({caller}, timeout=TIMEOUT)
    assert caller.cancelled() and gate.running == 1  # the thread still runs: so does its turn
    release.set()
    await wait_until(lambda: gate.running == 0)
    assert await gate.thread(lambda: 7) == 7


async def test_a_threads_error_reaches_its_caller_and_ends_its_turn() -> None:
    gate = Gate(1)

    def fail() -> None:
        raise ValueError("bad image")

    with pytest.raises(ValueError, match="bad image"):
        await gate.thread(fail)
    assert (gate.running, gate.free) == (0, True)


def test_a_gate_lets_at_least_one_through() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Gate(0)
