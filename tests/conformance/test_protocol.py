"""PROTOCOL.md's behaviours, the same on every engine (``chat_url`` is parametrized over them):
each test talks to a real server with a client written from PROTOCOL.md alone."""

from __future__ import annotations

import io
from typing import Any

from PIL import Image

from tests.support import RawPeer, raw_peer

# Long enough to be cancelled, reset or pinged mid-reply on every engine (the tiny model writes
# random tokens until max_new_tokens; the embedded one counts on).
LONG = "Write the numbers from 1 to 300 separated by spaces."
LONG_PARAMS = {"max_new_tokens": 400, "temperature": 0.0}


async def prompt(peer: RawPeer, frame_id: str, text: str, **params: Any) -> list[dict[str, Any]]:
    await peer.send({"type": "prompt", "id": frame_id, "text": text, "params": params})
    return await peer.recv_until("done")


async def start_long(peer: RawPeer, frame_id: str) -> None:
    """A long reply, running: its first token has arrived."""
    await peer.send({"type": "prompt", "id": frame_id, "text": LONG, "params": LONG_PARAMS})
    await peer.recv_until("token")


def of(frames: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [f for f in frames if f["type"] == kind]


async def test_tokens_stream_after_start_and_their_texts_concat_to_done_text(
    chat_url: str,
) -> None:
    async with raw_peer(chat_url) as (peer, _):
        frames = await prompt(peer, "a", "What is the capital of France?", max_new_tokens=12)
    done, tokens = frames[-1], of(frames, "token")
    assert frames[0]["type"] == "start" and frames[0]["id"] == "a"
    assert tokens and "".join(t["text"] for t in tokens) == done["text"]
    indexes = [t["index"] for t in tokens]
    assert indexes == sorted(set(indexes)) and indexes[-1] <= 12
    assert done["reason"] in ("stop", "length") and len(of(frames, "done")) == 1
    assert done["usage"]["prompt_tokens"] == frames[0]["prompt_tokens"]


async def test_max_new_tokens_ends_the_reply_with_reason_length(chat_url: str) -> None:
    async with raw_peer(chat_url) as (peer, _):
        done = (await prompt(peer, "a", LONG, max_new_tokens=3, temperature=0.0))[-1]
    assert done["reason"] == "length" and done["usage"]["completion_tokens"] == 3


async def test_cancel_mid_reply_gives_one_done_cancelled_and_the_session_goes_on(
    chat_url: str,
) -> None:
    async with raw_peer(chat_url) as (peer, _):
        await start_long(peer, "a")
        await peer.send({"type": "cancel", "id": "a"})
        frames = await peer.recv_until("done")
        await peer.send({"type": "ping", "t": "after"})
        pong = await peer.recv()
        after = (await prompt(peer, "b", "Hello.", max_new_tokens=4))[-1]
    assert frames[-1]["reason"] == "cancelled"
    assert frames[-1]["usage"]["completion_tokens"] < LONG_PARAMS["max_new_tokens"]
    assert pong == {"type": "pong", "t": "after"}
    assert after["id"] == "b" and after["reason"] in ("stop", "length")


async def test_reset_mid_reply_sends_done_then_reset_ok_and_clears_the_conversation(
    chat_url: str,
) -> None:
    async with raw_peer(chat_url) as (peer, _):
        first = await prompt(peer, "a", "Hello.", max_new_tokens=4)
        await start_long(peer, "b")
        await peer.send({"type": "reset"})
        frames = await peer.recv_until("reset_ok")
        again = await prompt(peer, "c", "Hello.", max_new_tokens=4)
    kinds = [f["type"] for f in frames]
    assert kinds.index("done") < kinds.index("reset_ok")
    assert of(frames, "done")[0]["reason"] == "cancelled"
    # a fresh conversation: the same first turn as before, token for token
    assert again[0]["prompt_tokens"] == first[0]["prompt_tokens"]


async def test_configure_sets_the_system_prompt_and_default_params(chat_url: str) -> None:
    short = "You are terse."
    longer = short + " You answer every question in one word, never more, and never explain."
    async with raw_peer(chat_url) as (peer, _):
        answers: list[Any] = []
        for i, system in enumerate((short, longer)):
            await peer.send(
                {"type": "configure", "system": system, "params": {"max_new_tokens": 2}}
            )
            answers.append(await peer.recv())
            answers.append(await prompt(peer, f"p{i}", "Hello."))
            await peer.send({"type": "reset"})
            await peer.recv_until("reset_ok")
    configured, with_short, _, with_longer = answers
    assert configured == {"type": "configured"}
    # the system prompt is part of the prompt: a longer one makes it longer
    assert with_longer[0]["prompt_tokens"] > with_short[0]["prompt_tokens"]
    for frames in (with_short, with_longer):  # the configured default, not the server's
        done = frames[-1]
        assert done["usage"]["completion_tokens"] <= 2
        assert done["reason"] == "length" or done["usage"]["completion_tokens"] < 2


async def test_a_reused_prompt_id_is_invalid_params(chat_url: str) -> None:
    async with raw_peer(chat_url) as (peer, _):
        await prompt(peer, "a", "Hello.", max_new_tokens=2)
        await peer.send({"type": "prompt", "id": "a", "text": "Again.", "params": {}})
        error = await peer.recv()
        await peer.send({"type": "ping", "t": 1})
        pong = await peer.recv()
    assert error["type"] == "error" and error["code"] == "invalid_params" and error["id"] == "a"
    assert pong == {"type": "pong", "t": 1}


async def test_a_second_prompt_while_one_runs_is_busy_and_the_first_goes_on(
    chat_url: str,
) -> None:
    async with raw_peer(chat_url) as (peer, _):
        await start_long(peer, "a")
        await peer.send({"type": "prompt", "id": "b", "text": "Hi.", "params": {}})
        await peer.send({"type": "ping", "t": "mid-reply"})
        frames = await peer.recv_until("pong")
        await peer.send({"type": "cancel", "id": "a"})
        frames += await peer.recv_until("done")
    errors = of(frames, "error")
    assert [(e["code"], e["id"]) for e in errors] == [("busy", "b")]
    assert frames[-1]["id"] == "a" and frames[-1]["reason"] == "cancelled"
    assert not [f for f in frames if f.get("id") == "b" and f["type"] != "error"]


async def test_a_text_only_model_says_so_and_refuses_images_as_unsupported(chat_url: str) -> None:
    png = io.BytesIO()
    Image.new("RGB", (8, 8), (255, 0, 0)).save(png, format="PNG")
    async with raw_peer(chat_url) as (peer, ready):
        await peer.send({"type": "image", "id": "i", "data": png.getvalue()})
        error = await peer.recv()
        after = (await prompt(peer, "a", "Hello.", max_new_tokens=2))[-1]
    assert ready["capabilities"] == {"images": False, "max_images": 0}
    assert error["type"] == "error" and error["code"] == "unsupported" and error["id"] == "i"
    assert after["reason"] in ("stop", "length")
