"""``Burst``: prompts that reach the gateway together leave for the engine together.

An engine that batches (llama.cpp's server, vLLM) starts on the first request it sees: a prompt
that arrives while that one prefills waits for the whole prefill and a decode step before its
own. Prompts that clients sent at once reach the gateway over a few loop iterations (a socket
each), spread further where the gateway shares its core with other work, and they reached the
engine spread as much. So each request waits until no other joined for ``quiet_s`` and the
event loop then turned ``turns`` times without one (frames it had read and not handed over yet
get their turn), never longer than ``cap_s`` from its own arrival: the first request of a burst
waits for the last, then all leave on the same turn. A lone request waits ``quiet_s`` and a
few idle turns of the loop.
"""

from __future__ import annotations

import asyncio

QUIET_S = 0.002
TURNS = 16
CAP_S = 0.010


class Burst:
    def __init__(self, quiet_s: float = QUIET_S, turns: int = TURNS, cap_s: float = CAP_S) -> None:
        self.quiet_s, self.turns, self.cap_s = quiet_s, turns, cap_s
        self._joined = 0  # requests that ever joined: a waiter sees whether more came
        self._last = 0.0  # when the newest joined (the loop's clock)

    async def join(self) -> None:
        """Return once the burst this request belongs to has stopped arriving."""
        loop = asyncio.get_running_loop()
        arrived = self._last = loop.time()
        self._joined += 1
        while (now := loop.time()) < arrived + self.cap_s:
            quiet_at = self._last + self.quiet_s
            if now < quiet_at:
                await asyncio.sleep(min(quiet_at, arrived + self.cap_s) - now)
                continue
            seen = self._joined
            for _ in range(self.turns):
                await asyncio.sleep(0)
            if self._joined == seen:
                return
