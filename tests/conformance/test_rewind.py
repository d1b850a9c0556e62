"""``rewind`` and ``regenerate`` (PROTOCOL.md section 5), the same on every engine: what a
conversation holds after either is what a fresh one with the same turns holds, token for token,
and ``done.turn`` numbers its exchanges."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from tests.support import RawPeer, raw_peer

from .test_protocol import of, prompt, start_long

GREEDY = {"max_new_tokens": 6, "temperature": 0.0}
TURNS = ("Name a colour.", "Name a fruit.", "Name a city.")


Forget = Callable[[], Awaitable[None]]


async def turns(peer: RawPeer, *texts: str, forget: Forget) -> list[dict[str, Any]]:
    """One greedy exchange per text, prompted ``t1``, ``t2``, ...; their ``done`` frames. The
    engine forgets its cached prompts before each (``forget_engine_cache``)."""
    done = []
    for i, text in enumerate(texts, 1):
        await forget()
        done.append((await prompt(peer, f"t{i}", text, **GREEDY))[-1])
    return done


async def test_a_rewind_then_a_prompt_is_a_fresh_conversation_of_the_kept_turns(
    chat_url: str, forget_engine_cache: Forget
) -> None:
    forget = forget_engine_cache
    async with raw_peer(chat_url) as (peer, _):
        done = await turns(peer, *TURNS, forget=forget)
        await peer.send({"type": "rewind", "keep": 1})
        rewound = await peer.recv()
        await forget()
        after = (await prompt(peer, "b", "Name an animal.", **GREEDY))[-1]
    async with raw_peer(chat_url) as (peer, _):
        fresh = (await turns(peer, TURNS[0], "Name an animal.", forget=forget))[-1]
    assert [d["turn"] for d in done] == [1, 2, 3]
    assert rewound == {"type": "rewound", "turns": 1}
    assert after["turn"] == fresh["turn"] == 2
    assert after["usage"]["prompt_tokens"] == fresh["usage"]["prompt_tokens"]
    assert after["text"] == fresh["text"]


async def test_a_regenerate_with_the_same_greedy_params_gives_the_same_reply(
    chat_url: str, forget_engine_cache: Forget
) -> None:
    forget = forget_engine_cache
    async with raw_peer(chat_url) as (peer, _):
        _, second = await turns(peer, *TURNS[:2], forget=forget)
        await forget()
        await peer.send({"type": "regenerate", "id": "r", "params": GREEDY})
        frames = await peer.recv_until("done")
        await forget()
        after = (await prompt(peer, "c", TURNS[2], **GREEDY))[-1]
    async with raw_peer(chat_url) as (peer, _):
        unbroken = (await turns(peer, *TURNS, forget=forget))[-1]
    again = frames[-1]
    assert frames[0]["type"] == "start" and frames[0]["id"] == "r"
    assert (again["turn"], again["text"]) == (2, second["text"])
    assert again["usage"]["prompt_tokens"] == second["usage"]["prompt_tokens"]
    assert "".join(t["text"] for t in of(frames, "token")) == again["text"]
    # the regenerated reply took the old one's place: the conversation goes on as before
    assert (after["turn"], after["text"]) == (3, unbroken["text"])
    assert after["usage"]["prompt_tokens"] == unbroken["usage"]["prompt_tokens"]


async def test_rewind_and_regenerate_are_refused_as_the_spec_says(chat_url: str) -> None:
    async with raw_peer(chat_url) as (peer, _):
        await peer.send({"type": "regenerate", "id": "r"})
        nothing = await peer.recv()
        await peer.send({"type": "rewind", "keep": 1})
        past = await peer.recv()
        await peer.send({"type": "rewind"})
        missing = await peer.recv()
        await start_long(peer, "a")
        await peer.send({"type": "rewind", "keep": 0})
        await peer.send({"type": "regenerate", "id": "r"})
        await peer.send({"type": "cancel", "id": "a"})
        frames = await peer.recv_until("done")
        await peer.send({"type": "rewind", "keep": 0})
        after = await peer.recv()
    assert (nothing["code"], nothing["id"]) == ("invalid_params", "r")
    assert (past["code"], past.get("id")) == ("invalid_params", None)
    assert "holds 0 exchanges" in past["message"]
    assert (missing["code"], missing.get("id")) == ("bad_frame", None)
    busy = [(e["code"], e.get("id")) for e in of(frames, "error")]
    assert busy == [("busy", None), ("busy", "r")]
    assert (frames[-1]["reason"], frames[-1]["turn"]) == ("cancelled", 1)
    assert after == {"type": "rewound", "turns": 0}


async def test_a_regenerate_with_the_same_seed_gives_the_same_sampled_reply_another_seed_not(
    chat_url: str, forget_engine_cache: Forget
) -> None:
    sampled = {"max_new_tokens": 8, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    replies = []
    async with raw_peer(chat_url) as (peer, _):
        await turns(peer, "Tell me a word.", forget=forget_engine_cache)
        for i, seed in enumerate((1, 1, 2)):
            params = {**sampled, "seed": seed}
            await forget_engine_cache()
            await peer.send({"type": "regenerate", "id": f"r{i}", "params": params})
            replies.append((await peer.recv_until("done"))[-1])
    same, again, other = (r["text"] for r in replies)
    assert [r["turn"] for r in replies] == [1, 1, 1]
    assert same == again and other != same
