"""``Burst``: requests that arrive together leave together, a lone one leaves once the loop is
quiet, and a trickle that never stops is let go at the cap."""

from __future__ import annotations

import asyncio

from wschat.server.engine.openai.burst import Burst

from tests.support import TIMEOUT


async def arrivals(burst: Burst, count: int, gap_s: float) -> tuple[list[int], list[int]]:
    """``count`` requests joining ``gap_s`` apart: (the order they joined, the order they left),
    each as the number of requests that had joined when it left."""
    joined: list[int] = []
    left: list[int] = []

    async def one(i: int) -> None:
        joined.append(i)
        await burst.join()
        left.append(len(joined))

    tasks = []
    for i in range(count):
        tasks.append(asyncio.create_task(one(i)))
        await asyncio.sleep(gap_s)
    await asyncio.wait_for(asyncio.gather(*tasks), TIMEOUT)
    return joined, left


async def test_requests_joining_closer_than_the_quiet_gap_all_leave_after_the_last() -> None:
    burst = Burst(quiet_s=0.05, cap_s=5.0)
    _, left = await arrivals(burst, 5, 0.005)
    assert left == [5] * 5


async def test_a_lone_request_leaves_once_the_loop_has_been_quiet() -> None:
    burst = Burst(quiet_s=0.001, cap_s=5.0)
    _, left = await arrivals(burst, 1, 0.0)
    assert left == [1]


async def test_a_trickle_that_never_pauses_is_let_go_at_the_cap() -> None:
    burst = Burst(quiet_s=0.05, cap_s=0.1)
    _, left = await arrivals(burst, 40, 0.01)  # 0.4 s of arrivals, never quiet for 0.05 s
    assert left[0] < 40  # the first left before the last came
    assert left[-1] == 40
