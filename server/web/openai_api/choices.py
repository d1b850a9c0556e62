"""A request's ``n`` choices: ``n`` replies to its one prompt, each a ``Reply`` (a session of its
own, in a slot of its own) under the request's id, answered as one response: whole, its choices
in order, or streamed, each chunk naming its choice's ``index``, one usage chunk and one
``[DONE]`` at the end. The usage counts the prompt once and every choice's tokens.

Each choice has its own seed stream: the request's ``seed`` plus the choice's index (a seed
left out: each choice its own random one). The batched engine prefills the prompt once for all
of them (engine/local/siblings.py); the others start from its state, their
``cached_tokens`` the prompt's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

from wschat.protocol import Done, Start

from ...sessions import Complete, Converse
from .errors import ApiError
from .reply import Reply
from .requests import Sampling

_SEEDS = 1 << 64  # a seed's span (PROTOCOL.md "params": -2^63 .. 2^64-1)


def choice_prompt(prompt: Converse | Complete, index: int) -> Converse | Complete:
    """The prompt as choice ``index`` is asked it: its own seed stream."""
    params = prompt.params
    if index == 0 or params is None or params.seed is None:
        return prompt
    seed = params.seed + index
    if seed >= _SEEDS:  # past the top of the span: wrapped, as a 64-bit seed does
        seed -= _SEEDS
    return dataclasses.replace(prompt, params=dataclasses.replace(params, seed=seed))


class Choices:
    """The replies of one request, answered as ``Reply`` answers one (routes.py drives either)."""

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = replies
        self._dones: list[Done] = []

    @classmethod
    async def begin(
        cls, make: Callable[[int], Reply], prompt: Converse | Complete, n: int
    ) -> Choices:
        """``n`` replies made by ``make`` (its index), each given the prompt; a refusal of
        any ends those that began."""
        replies: list[Reply] = []
        try:
            for index in range(n):
                replies.append(make(index))
                await replies[-1].begin(choice_prompt(prompt, index))
        except BaseException:
            for reply in replies:
                reply.cancel()
            raise
        return cls(replies)

    def cancel(self) -> None:
        for reply in self.replies:
            reply.cancel()

    async def first(self) -> Start | ApiError:
        """The first choice's ``start`` once every choice started, or the first error."""
        firsts = await asyncio.gather(*(reply.first() for reply in self.replies))
        for first in firsts:
            if isinstance(first, ApiError):
                self.cancel()
                return first
        start = firsts[0]
        assert isinstance(start, Start)
        return start

    async def whole(self) -> tuple[Done, ApiError | None] | None:
        """The first choice's ``done`` and the first error, once every choice ended; None once
        the client is gone."""
        ended = await asyncio.gather(*(reply.whole() for reply in self.replies))
        if any(end is None for end in ended):
            return None
        pairs = [end for end in ended if end is not None]
        self._dones = [done for done, _ in pairs]
        errors = [error for _, error in pairs if error is not None]
        return self._dones[0], errors[0] if errors else None

    def body(self, done: Done) -> dict[str, Any]:
        """The whole response: every choice's, in order, and the usage of all."""
        bodies = [reply.body(d) for reply, d in zip(self.replies, self._dones, strict=True)]
        merged = bodies[0]
        merged["choices"] = [body["choices"][0] for body in bodies]
        merged["usage"] = usage_of(self._dones)
        return merged

    async def events(self, sampling: Sampling, start: Start) -> AsyncIterator[bytes]:
        """Every choice's events as they come, then the usage chunk and ``[DONE]``."""
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def pump(reply: Reply) -> None:
            try:
                async for event in reply.events(sampling, start, whole=False):
                    await queue.put(event)
            finally:
                await queue.put(None)

        tasks = [asyncio.create_task(pump(reply)) for reply in self.replies]
        try:
            left = len(tasks)
            while left:
                event = await queue.get()
                if event is None:
                    left -= 1
                else:
                    yield event
            self._dones = [reply.done for reply in self.replies if reply.done is not None]
            if sampling.include_usage and len(self._dones) == len(self.replies):
                yield self.replies[0].event(self.replies[0].usage_chunk(usage_of(self._dones)))
            yield b"data: [DONE]\n\n"
        finally:
            for task in tasks:
                task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(*tasks, return_exceptions=True)
            self.cancel()


def usage_of(dones: list[Done]) -> dict[str, Any]:
    """The usage of every choice: the prompt once (with the first choice's cached tokens), the
    tokens each generated."""
    prompt = dones[0].usage.prompt_tokens
    completion = sum(done.usage.completion_tokens for done in dones)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": dones[0].usage.cached_tokens},
    }
