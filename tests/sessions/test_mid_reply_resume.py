"""Mid-reply resume in one process (PROTOCOL.md section 10), through a real server and a real
WebSocket client: a connection dropped mid-reply without a close frame (the client's transport
aborted) keeps its reply generating for ``--resume-grace-s``; a resume naming the last token
index it got receives the rest, the missed text in one ``token`` frame, none of it twice; past
the grace the reply is cancelled and kept; a clean close still cancels at once.

The tiny random model on the batched engine gives the same greedy reply every time, so the text
pieced together across a drop can be compared with an uninterrupted reply to the same prompt;
the scripted engine gives exact control of when tokens come.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pytest
from wschat.protocol import FinishReason

from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import RawPeer, raw_peer, running_server, wait_until

if TYPE_CHECKING:
    from wschat.server.engine.local.batched import BatchedEngine
    from wschat.server.engine.local.loader import LoadedModel

PROMPT = "Tell me a long story about the sea."
REPLY_TOKENS = 160
ENDLESS = 100_000  # a scripted reply that only a cancel ends


@pytest.fixture
async def batched(tiny_text_loaded: LoadedModel) -> AsyncIterator[BatchedEngine]:
    from wschat.server.engine.local.batched import BatchedEngine
    from wschat.server.engine.local.options import LocalEngineOptions

    engine = BatchedEngine(tiny_text_loaded, LocalEngineOptions(width=2, prefill_tokens=64))
    yield engine
    await engine.aclose()


def endless(delay_s: float = 0.005) -> ScriptedEngine:
    return ScriptedEngine(lambda r: Script([f" t{i}" for i in range(ENDLESS)], delay_s=delay_s))


async def prompt(peer: RawPeer, id: str, text: str = PROMPT, max_new_tokens: int = 0) -> None:
    params = {"max_new_tokens": max_new_tokens} if max_new_tokens else {}
    await peer.send({"type": "prompt", "id": id, "text": text, "params": params})


async def tokens_until(peer: RawPeer, count: int) -> list[dict[str, Any]]:
    """Token frames until ``count`` of them came (other frames skipped)."""
    tokens: list[dict[str, Any]] = []
    while len(tokens) < count:
        frame = await peer.recv()
        assert frame["type"] in ("queued", "start", "token"), frame
        if frame["type"] == "token":
            tokens.append(frame)
    return tokens


def drop(peer: RawPeer) -> None:
    """Cut the TCP connection without a close frame, as a lost network does."""
    peer.ws.transport.abort()


async def dropped_until_it_ends(
    url: str, engine: ScriptedEngine
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A prompt whose connection is dropped after its first token, and the wait until its
    generation is over; the ``ready`` and the token frames the client got."""
    ready, got = await left_mid_reply(url, 1)
    await wait_until(lambda: not engine.threads)
    return ready, got


async def left_mid_reply(
    url: str, count: int, close_code: int | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A prompt whose connection is dropped (or closed with ``close_code``) once ``count``
    token frames came; the ``ready`` and those frames."""
    async with raw_peer(url) as (peer, ready):
        await prompt(peer, "p1")
        got = await tokens_until(peer, count)
        if close_code is None:
            drop(peer)
        else:
            await peer.ws.close(code=close_code)
    return ready, got


def resume_url(url: str, ready: dict[str, Any], last: int | None) -> str:
    query = f"session={ready['session']}&resume={ready['resume']}"
    return f"{url}?{query}" + ("" if last is None else f"&last={last}")


def token_text(frames: list[dict[str, Any]]) -> str:
    return "".join(f["text"] for f in frames if f["type"] == "token")


async def test_a_reply_dropped_mid_stream_resumes_with_every_token_once(
    batched: BatchedEngine,
) -> None:
    async with running_server(batched) as url:
        async with raw_peer(url) as (peer, _):
            await prompt(peer, "p1", max_new_tokens=REPLY_TOKENS)
            whole = (await peer.recv_until("done"))[-1]
        async with raw_peer(url) as (peer, ready):
            await prompt(peer, "p1", max_new_tokens=REPLY_TOKENS)
            got = await tokens_until(peer, 2)
            drop(peer)
        last = got[-1]["index"]
        async with raw_peer(resume_url(url, ready, last)) as (peer, resumed):
            rest = await peer.recv_until("done")
    assert resumed["session"] == ready["session"]
    assert resumed["resumed"] == {"last_prompt": None, "reply": "p1", "turns": 0}
    assert [f["type"] for f in rest][-1] == "done"
    indices = [f["index"] for f in [*got, *rest] if f["type"] == "token"]
    assert indices == sorted(set(indices))  # rising: nothing repeated
    assert token_text(got) + token_text(rest) == rest[-1]["text"] == whole["text"]
    assert rest[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]


async def test_the_resumed_stream_is_the_missed_text_in_one_frame_then_live_frames() -> None:
    engine = endless()
    async with running_server(engine) as url:
        ready, got = await left_mid_reply(url, 3)
        async with raw_peer(resume_url(url, ready, got[0]["index"])) as (peer, resumed):
            assert resumed["resumed"] == {"last_prompt": None, "reply": "p1", "turns": 0}
            replay, *live = await tokens_until(peer, 4)
            await peer.send({"type": "cancel", "id": "p1"})
            tail = await peer.recv_until("done")
    sent = [replay, *live, *(f for f in tail if f["type"] == "token")]
    # from the frame after the one it named: the two the client got but did not name included
    assert replay["text"].startswith(got[1]["text"] + got[2]["text"])
    assert [f["index"] for f in sent] == sorted({f["index"] for f in sent})
    text = got[0]["text"] + token_text(sent)
    generated = tail[-1]["usage"]["completion_tokens"]
    assert text == tail[-1]["text"] == "".join(f" t{i}" for i in range(generated))
    assert tail[-1]["reason"] == FinishReason.CANCELLED.value


async def test_a_reply_that_ends_within_the_grace_is_replayed_with_its_done() -> None:
    engine = ScriptedEngine(lambda r: Script([f" t{i}" for i in range(40)], delay_s=0.002))
    async with running_server(engine) as url:
        ready, got = await dropped_until_it_ends(url, engine)  # it ran on to its end
        async with raw_peer(resume_url(url, ready, got[0]["index"])) as (peer, resumed):
            rest = await peer.recv_until("done")
            await prompt(peer, "p2", "next")  # the session goes on from the finished exchange
            nxt = await peer.recv_until("done")
    assert resumed["resumed"] == {"last_prompt": "p1", "reply": "p1", "turns": 1}
    assert [f["type"] for f in rest] == ["token", "done"]
    assert got[0]["text"] + rest[0]["text"] == rest[-1]["text"]
    assert rest[-1]["reason"] == FinishReason.STOP.value
    assert nxt[-1]["reason"] == FinishReason.STOP.value


async def test_past_the_grace_the_reply_is_cancelled_and_kept() -> None:
    engine = endless()
    async with running_server(engine, resume_grace_s=0.2) as url:
        ready, got = await dropped_until_it_ends(url, engine)  # only a cancel ends it
        async with raw_peer(resume_url(url, ready, got[0]["index"])) as (peer, resumed):
            rest = await peer.recv_until("done")
            await prompt(peer, "p2", "next")
            start = (await peer.recv_until("start"))[-1]
            await peer.send({"type": "cancel"})
            await peer.recv_until("done")
    assert resumed["resumed"] == {"last_prompt": "p1", "reply": "p1", "turns": 1}
    done = rest[-1]
    assert done["reason"] == FinishReason.CANCELLED.value
    assert got[0]["text"] + token_text(rest) == done["text"]
    # the cancelled exchange is in the conversation: the next prompt is rendered after it
    usage = done["usage"]
    assert start["prompt_tokens"] > usage["prompt_tokens"] + usage["completion_tokens"]


async def test_a_clean_close_mid_reply_cancels_at_once() -> None:
    engine = endless()
    async with running_server(engine) as url:
        async with raw_peer(url) as (peer, ready):
            await prompt(peer, "p1")
            await tokens_until(peer, 1)
        # closed with 1000 by raw_peer: no grace (a long grace would keep it running)
        await wait_until(lambda: not engine.threads)
        async with raw_peer(resume_url(url, ready, None)) as (peer, resumed):
            await peer.send({"type": "ping", "t": 1})
            assert (await peer.recv())["type"] == "pong"  # nothing of p1 came first
    assert resumed["resumed"] == {"last_prompt": "p1", "reply": None, "turns": 1}


async def test_a_close_frame_with_another_code_counts_as_a_drop() -> None:
    engine = endless()
    async with running_server(engine) as url:
        ready, got = await left_mid_reply(url, 1, close_code=4000)  # the reply goes on
        async with raw_peer(resume_url(url, ready, got[0]["index"])) as (peer, resumed):
            more = await tokens_until(peer, 2)
            await peer.send({"type": "cancel"})
            await peer.recv_until("done")
    assert resumed["resumed"] == {"last_prompt": None, "reply": "p1", "turns": 0}
    assert more[0]["index"] > got[0]["index"]


async def test_with_no_grace_a_drop_cancels_at_once_as_before() -> None:
    engine = endless()
    async with running_server(engine, resume_grace_s=0.0) as url:
        ready, got = await dropped_until_it_ends(url, engine)
        async with raw_peer(resume_url(url, ready, got[0]["index"])) as (peer, resumed):
            rest = await peer.recv_until("done")
    # the client said it had a reply in flight: it gets the rest of what was sent, and done
    assert resumed["resumed"] == {"last_prompt": "p1", "reply": "p1", "turns": 1}
    assert rest[-1]["reason"] == FinishReason.CANCELLED.value
    assert got[0]["text"] + token_text(rest) == rest[-1]["text"]


async def test_a_drop_while_queued_cancels_the_prompt_at_once() -> None:
    """Nothing of it was sent, so nothing is kept for a resume: it gives its place up at once."""
    engine = endless()
    async with (
        running_server(engine, max_concurrent=1) as url,
        raw_peer(url) as (hog, _),
        raw_peer(url) as (peer, ready),
    ):
        await prompt(hog, "h1")
        await tokens_until(hog, 1)
        await prompt(peer, "p1")
        assert (await peer.recv())["type"] == "queued"
        drop(peer)
        # the hog still runs: a prompt still queued would not be done yet
        async with raw_peer(resume_url(url, ready, None)) as (peer, resumed):
            frames = await peer.recv_until("done")
        await hog.send({"type": "cancel"})
        await hog.recv_until("done")
    assert resumed["resumed"] == {"last_prompt": None, "reply": "p1", "turns": 0}
    assert [f["type"] for f in frames] == ["done"]
    assert frames[-1]["reason"] == FinishReason.CANCELLED.value
    assert len(engine.requests) == 1  # p1 never reached the engine


async def test_a_drop_before_the_first_token_cancels_the_reply_at_once() -> None:
    # a token a second: the drop, right after start, comes before the first
    engine = ScriptedEngine(lambda r: Script([f" t{i}" for i in range(100)], delay_s=1.0))
    async with running_server(engine) as url:
        async with raw_peer(url) as (peer, ready):
            await prompt(peer, "p1")
            assert (await peer.recv())["type"] == "start"
            drop(peer)
        async with raw_peer(resume_url(url, ready, 0)) as (peer, resumed):
            frames = await peer.recv_until("done")  # held, it would go on for 100 s
    assert resumed["resumed"] == {"last_prompt": "p1", "reply": "p1", "turns": 1}
    done = frames[-1]
    assert done["reason"] == FinishReason.CANCELLED.value
    assert done["usage"]["completion_tokens"] <= 1  # the one the engine had under way, if any
