"""``python -m bench.rewind``: what editing an earlier message costs (issue 25), on wschat with
the embedded model over a real server and WebSocket.

Each round, on one session: a 10-turn greedy conversation (``workload.CONVERSATION``), then its
3rd user message edited (``rewind {keep: 2}``, ``rewound``, then a ``prompt`` with the new
text), timed from the prompt to its first token; then, as a client without rewind does it,
``reset``, turns 1-2 sent again (their replies run to the end) and the new 3rd: timed from the
reset to the 3rd's first token. That 3rd turn is also the plain 3rd turn the edit is measured
against (its cache is turns 1-2 alone): same text, same prompt, its TTFT timed the same way.
Replies that are only timed to their first token are cancelled there.

Checked: the edit's ``cached_tokens`` against the tokens of turns 1-2 (the edited prompt's
``prompt_tokens`` less the tokens the 3rd turn adds, which a first turn of the same text has
after its BOS). It is more by the opening the edited message shares with the old one (the turn
markup and its first words): the engines reuse the longest common prefix. The local engines keep
a sliding-window layer's last ``window`` positions only, so a cache longer than the window
cannot be cut back to turns 1-2 (``kvstore.window_holds``): the edit then prefills the whole
prompt. ``--reply-tokens`` sets the replies' lengths, one configuration each: the default pair
keeps one conversation under the window (512 for the embedded Gemma 3 270M) and takes the other
past it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import procs, render
from .answers import cpu_name
from .figures import Section, Target, at_most
from .stats import median
from .workload import CONVERSATION
from .wsload import Peer, session

log = logging.getLogger("bench.rewind")

EDITED = "What changed with disc brakes?"  # the 3rd message as edited: as long as the original
TARGET = 1.2  # the edit's TTFT over the plain 3rd turn's, at most
RESULTS = Path(__file__).parent / "results" / "rewind.json"


@dataclass(frozen=True, slots=True)
class Work:
    reply_tokens: tuple[int, ...] = (24, 100)
    rounds: int = 3
    turns: int = 10
    kept: int = 2  # the edit rewinds to these exchanges and replaces the next one

    @classmethod
    def quick(cls) -> Work:
        return cls(reply_tokens=(16,), rounds=1)


@dataclass(slots=True)
class Round:
    """One round's figures (seconds, tokens)."""

    conversation_tokens: int  # what the session held before the edit: prompts and replies
    edit_ttft: float
    edit_rewind: float  # the rewind's round trip, before the edit's prompt
    edit_prompt_tokens: int
    edit_cached_tokens: int
    plain_ttft: float
    plain_prompt_tokens: int
    plain_cached_tokens: int
    retype: float  # from the reset to the retyped 3rd turn's first token
    turn_tokens: int  # the tokens the edited 3rd turn adds (a first turn's, less its BOS)

    @property
    def kept_tokens(self) -> int:
        """The tokens of the kept turns as the edited prompt lays them out."""
        return self.edit_prompt_tokens - self.turn_tokens


def run(work: Work, logs: Path, engine: str) -> dict[str, Any]:
    logs.mkdir(parents=True, exist_ok=True)
    configs = []
    with procs.wschat(engine, logs, sessions=16, name=f"wschat-rewind-{engine}") as server:
        for tokens in work.reply_tokens:
            rounds = asyncio.run(_rounds(server.ws_url, work, tokens))
            configs.append({"reply_tokens": tokens, **summary(rounds)})
    return {"workload": dataclasses.asdict(work), "engine": engine, "configs": configs}


async def _rounds(url: str, work: Work, tokens: int) -> list[Round]:
    async with session(url) as peer:  # the tokens the edited 3rd turn adds to a conversation
        first = await _ask(peer, "n", EDITED, 1)
    turn_tokens = first["start"]["prompt_tokens"] - 1  # its BOS is the conversation's
    out = []
    for i in range(work.rounds):
        async with session(url) as peer:
            out.append(await _round(peer, work, tokens, turn_tokens))
        log.info("%d-token replies, round %d: %s", tokens, i + 1, out[-1])
    return out


async def _round(peer: Peer, work: Work, tokens: int, turn_tokens: int) -> Round:
    held = 0
    for i, text in enumerate(CONVERSATION[: work.turns]):
        frames = await _ask(peer, f"t{i}", text, tokens)
        held = frames["start"]["prompt_tokens"] + frames["done"]["usage"]["completion_tokens"]
    sent = time.perf_counter()
    await peer.send({"type": "rewind", "keep": work.kept})
    rewound = await _until(peer, "rewound")
    rewind_s = time.perf_counter() - sent
    assert rewound["turns"] == work.kept, rewound
    edit = await _ask(peer, "e", EDITED, tokens, first_only=True)
    sent = time.perf_counter()
    await peer.send({"type": "reset", "id": "r"})
    await _until(peer, "reset_ok")
    for i, text in enumerate(CONVERSATION[: work.kept]):
        await _ask(peer, f"r{i}", text, tokens)
    plain = await _ask(peer, "p", EDITED, tokens, first_only=True)
    return Round(
        conversation_tokens=held,
        edit_ttft=edit["ttft"],
        edit_rewind=rewind_s,
        edit_prompt_tokens=edit["start"]["prompt_tokens"],
        edit_cached_tokens=edit["start"]["cached_tokens"],
        plain_ttft=plain["ttft"],
        plain_prompt_tokens=plain["start"]["prompt_tokens"],
        plain_cached_tokens=plain["start"]["cached_tokens"],
        retype=plain["first_at"] - sent,
        turn_tokens=turn_tokens,
    )


async def _ask(
    peer: Peer, frame_id: str, text: str, tokens: int, *, first_only: bool = False
) -> dict[str, Any]:
    """A greedy prompt: its ``start`` and ``done`` frames, its TTFT and when its first token
    came; ``first_only``: cancelled once its first token came."""
    params = {"max_new_tokens": tokens, "temperature": 0}
    sent = time.perf_counter()
    await peer.send({"type": "prompt", "id": frame_id, "text": text, "params": params})
    start = await _until(peer, "start")
    await _until(peer, "token")
    first_at = time.perf_counter()
    if first_only:
        await peer.send({"type": "cancel", "id": frame_id})
    done = await _until(peer, "done")
    return {"start": start, "done": done, "ttft": first_at - sent, "first_at": first_at}


async def _until(peer: Peer, kind: str) -> dict[str, Any]:
    """The next frame of type ``kind`` (the frames before it are dropped)."""
    while (frame := await peer.recv())["type"] != kind:
        if frame["type"] == "done":
            raise RuntimeError(f"done before {kind}: {frame}")
    return frame


# -- what the rounds add up to (no I/O: tests/bench/test_rewind.py) ------------------------------


def summary(rounds: Sequence[Round]) -> dict[str, Any]:
    edit, plain = median([r.edit_ttft for r in rounds]), median([r.plain_ttft for r in rounds])
    last = rounds[-1]
    return {
        "rounds": [dataclasses.asdict(r) | {"kept_tokens": r.kept_tokens} for r in rounds],
        "conversation_tokens": last.conversation_tokens,
        "kept_tokens": last.kept_tokens,
        "edit_cached_tokens": [r.edit_cached_tokens for r in rounds],
        "plain_cached_tokens": last.plain_cached_tokens,
        "edit_ttft_median_s": edit,
        "edit_rewind_median_s": median([r.edit_rewind for r in rounds]),
        "plain_ttft_median_s": plain,
        "retype_median_s": median([r.retype for r in rounds]),
        "edit_over_plain": edit / plain,
        # the edit reuses turns 1-2 (and whatever of the 3rd turn's opening it shares)
        "reused_kept_turns": all(r.edit_cached_tokens >= r.kept_tokens for r in rounds),
    }


def targets(result: dict[str, Any]) -> list[Target]:
    """Per reply length: the edit's TTFT within TARGET of the plain 3rd turn's."""
    return [
        Target.judged(
            f"rewind, {c['reply_tokens']}-token replies: edit TTFT <= {TARGET} x plain",
            value=c["edit_ttft_median_s"],
            against=c["plain_ttft_median_s"],
            ratio=c["edit_over_plain"],
            limit=at_most(TARGET),
            unit="ms",
        )
        for c in result["configs"]
    ]


def report(result: dict[str, Any]) -> Section:
    out = Section(
        [
            f"edit the 3rd of {result['workload']['turns']} turns, wschat --engine "
            f"{result['engine']}, embedded model, greedy; medians over rounds"
        ],
        targets(result),
    )
    for c in result["configs"]:
        out.parts += [
            f"{c['reply_tokens']}-token replies: conversation {c['conversation_tokens']} "
            f"tokens; turns 1-2 {c['kept_tokens']} tokens",
            f"  edit (rewind keep=2 + prompt): TTFT {c['edit_ttft_median_s'] * 1000:.0f} ms "
            f"(rewind round trip {c['edit_rewind_median_s'] * 1000:.1f} ms), cached_tokens "
            f"{c['edit_cached_tokens']} (turns 1-2: {c['kept_tokens']})",
            f"  plain 3rd turn: TTFT {c['plain_ttft_median_s'] * 1000:.0f} ms, cached_tokens "
            f"{c['plain_cached_tokens']}",
            f"  reset and retype (reset, turns 1-2, the 3rd to its first token): "
            f"{c['retype_median_s'] * 1000:.0f} ms",
            f"  edit / plain: {c['edit_over_plain']:.2f}",
        ]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rewind", description=__doc__)
    parser.add_argument("--engine", default="batched", choices=["batched", "generate"])
    parser.add_argument("--quick", action="store_true", help="one short configuration, 1 round")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--reply-tokens", type=int, action="append")
    parser.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()) / "wschat-bench")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the start-up's health polls
    work = Work.quick() if args.quick else Work()
    if args.rounds:
        work = dataclasses.replace(work, rounds=args.rounds)
    if args.reply_tokens:
        work = dataclasses.replace(work, reply_tokens=tuple(args.reply_tokens))
    load_before = os.getloadavg()
    result = run(work, args.logs, args.engine)
    result["command"] = "python -m bench.rewind " + " ".join(argv or sys.argv[1:])
    result["machine"] = {
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }
    print(f"cpu: {result['machine']['cpu']} ({result['machine']['cpu_count']} cores)")
    print(render.text(report(result)))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
