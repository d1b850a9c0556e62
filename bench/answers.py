"""``python -m bench.answers``: how often the embedded model answers plain questions right.

The questions and their accepted answers are bench/questions.json (``new``: mixed kinds, written
before the model answered any; ``holdout``: more of the same, written before the model answered
them, to check a format chosen on ``new`` is not fitted to it; ``old``: the set the README
quoted before; ``shapes``: requests for lists, code and poems, judged for the reply's shape).
Each conversation
goes through the engine the server builds (``BatchedEngine``), the chat a session holds
(``Chat``: the prompt format, the history, the stop rule) and the server's sampling
defaults (greedy), one conversation at a time, so a run is deterministic on one CPU.

``--variant NAME`` (repeatable) measures other transcript formats (bench/answer_variants.py);
``default`` is the server's own format, untouched. Prints each reply with pass/fail, the rates
by kind and set, and the CPU; ``--out`` writes them as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.answer_variants import VARIANTS

QUESTIONS = Path(__file__).with_name("questions.json")
ECHO_RUN = 5  # words in a row taken from the user's turn: a reply that has them echoes it
MAX_NEW_TOKENS = 64
# torch's thread count, fixed: the server's auto count follows other processes' load, and a sum
# split across another count of threads can flip a near tie in a greedy pick.
THREADS = 1
SETS = ("new", "holdout", "old", "shapes")
# A reply's shape, as a request for a list, code or a poem wants it (``Item.shape``).
_LIST_ITEM = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+\S", re.MULTILINE)
_CODE_BLOCK = re.compile(r"^\s*```[^\n]*\n[^\n]*\S", re.MULTILINE)  # its end may be cut
SHAPES = {
    "list": lambda reply: len(_LIST_ITEM.findall(reply)) >= 2,
    "code": lambda reply: _CODE_BLOCK.search(reply) is not None,
    "lines": lambda reply: sum(bool(line.strip()) for line in reply.splitlines()) >= 3,
}


@dataclass(frozen=True, slots=True)
class Item:
    kind: str
    turns: tuple[str, ...]
    any: tuple[str, ...] = ()
    all: tuple[str, ...] = ()
    at_least: tuple[int, tuple[str, ...]] | None = None
    none: tuple[str, ...] = ()
    no_echo: bool = False
    shape: str | None = None  # one of SHAPES

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Item:
        least = raw.get("at_least")
        return cls(
            kind=raw["kind"],
            turns=tuple(raw["turns"]),
            any=tuple(raw.get("any", ())),
            all=tuple(raw.get("all", ())),
            at_least=(int(least[0]), tuple(least[1])) if least else None,
            none=tuple(raw.get("none", ())),
            no_echo=bool(raw.get("no_echo", False)),
            shape=raw.get("shape"),
        )


def load(path: Path = QUESTIONS) -> dict[str, list[Item]]:
    """The sets by name (``SETS``)."""
    raw = json.loads(path.read_text())
    return {name: [Item.from_json(q) for q in raw[name]] for name in SETS}


def _found(pattern: str, text: str) -> bool:
    return re.search(pattern, text, re.IGNORECASE | re.DOTALL) is not None


def _words(text: str) -> list[str]:
    return re.findall(r"[\w']+", text.lower())


def echoes(said: str, reply: str, run: int = ECHO_RUN) -> bool:
    """Whether ``reply`` repeats ``run`` words in a row of what the user ``said``."""
    theirs, ours = _words(said), _words(reply)
    runs = {tuple(theirs[i : i + run]) for i in range(len(theirs) - run + 1)}
    return any(tuple(ours[i : i + run]) in runs for i in range(len(ours) - run + 1))


def judge(item: Item, reply: str) -> bool:
    """Whether ``reply``, the answer to the item's last turn, is one the item accepts."""
    if not reply.strip():
        return False
    if item.any and not any(_found(p, reply) for p in item.any):
        return False
    if not all(_found(p, reply) for p in item.all):
        return False
    if item.at_least is not None:
        need, patterns = item.at_least
        if sum(_found(p, reply) for p in patterns) < need:
            return False
    if any(_found(p, reply) for p in item.none):
        return False
    if item.shape is not None and not SHAPES[item.shape](reply):
        return False
    return not (item.no_echo and echoes(item.turns[-1], reply))


@dataclass(slots=True)
class Tally:
    passed: Counter[str] = field(default_factory=Counter)
    asked: Counter[str] = field(default_factory=Counter)

    def add(self, kind: str, ok: bool) -> None:
        self.asked[kind] += 1
        self.passed[kind] += ok

    def total(self) -> tuple[int, int]:
        return sum(self.passed.values()), sum(self.asked.values())

    def line(self) -> str:
        got, of = self.total()
        kinds = ", ".join(f"{k} {self.passed[k]}/{n}" for k, n in self.asked.items())
        return f"{got}/{of} ({kinds})"


def tally(items: Sequence[Item], replies: Sequence[Sequence[str]]) -> Tally:
    t = Tally()
    for item, said in zip(items, replies, strict=True):
        t.add(item.kind, judge(item, said[-1]))
    return t


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _use_variant(engine: Any, name: str) -> None:
    """Render with the transcript variant ``name`` (``default``: the format as built)."""
    from wschat.server.engine.formats import TokenizerCodec, Transcript, newline_ids

    if name == "default":
        return
    variant = VARIANTS[name]
    tokenizer = engine.tokenizer
    lines = newline_ids(tokenizer)
    eos = engine.prompt_format.end_ids - lines
    fmt = Transcript(
        TokenizerCodec(tokenizer),
        eos,
        lines,
        bos=tokenizer.bos_token,
        instruction=variant.instruction,
        examples=variant.examples,
        labels=variant.labels,
    )
    engine.prompt_format = fmt


async def _converse(engine: Any, key: str, turns: Sequence[str], limit: int) -> list[str]:
    from wschat.server.engine import Chat, Finished, SamplingParams, Turn

    chat = Chat(engine, key)
    replies = []
    try:
        for text in turns:
            prepared = await chat.prepare(
                Turn(text, SamplingParams(max_new_tokens=limit)), max_user_tokens=4096
            )
            generation = chat.start(prepared)
            async for item in generation.items():
                if isinstance(item, Finished):
                    replies.append(item.text)
    finally:
        chat.reset()
    return replies


async def measure(
    variants: Sequence[str],
    sets: Sequence[str] = SETS,
    limit: int = MAX_NEW_TOKENS,
    threads: int = THREADS,
    log: Any = sys.stdout,
) -> dict[str, Any]:
    """Every variant on both sets: replies, pass/fail and rates."""
    from wschat.server.engine.local.batched import BatchedEngine
    from wschat.server.engine.local.loader import load_model
    from wschat.server.engine.local.threads import ThreadPolicy

    questions = load()
    policy = ThreadPolicy(threads)
    engine = await asyncio.to_thread(lambda: BatchedEngine(load_model("embedded"), threads=policy))
    original = engine.prompt_format
    out: dict[str, Any] = {}
    try:
        for variant in variants:
            engine.prompt_format = original
            _use_variant(engine, variant)
            result: dict[str, Any] = {}
            for set_name in sets:
                items = questions[set_name]
                replies = []
                for n, item in enumerate(items):
                    said = await _converse(engine, f"{variant}-{set_name}-{n}", item.turns, limit)
                    ok = judge(item, said[-1])
                    print(
                        f"{variant} {set_name} {'PASS' if ok else 'fail'} {item.turns} -> {said}",
                        file=log,
                        flush=True,
                    )
                    replies.append(said)
                t = tally(items, replies)
                got, of = t.total()
                result[set_name] = {
                    "passed": got,
                    "asked": of,
                    "by_kind": {k: [t.passed[k], n] for k, n in t.asked.items()},
                    "replies": [
                        {"turns": list(i.turns), "replies": r, "pass": judge(i, r[-1])}
                        for i, r in zip(items, replies, strict=True)
                    ],
                }
                print(f"{variant} {set_name}: {t.line()}", file=log, flush=True)
            out[variant] = result
    finally:
        await engine.aclose()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.answers", description=__doc__)
    parser.add_argument(
        "--variant", action="append", choices=["all", *VARIANTS], help="(default: default)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--set", action="append", choices=SETS, help="(default: all)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    variants = list(VARIANTS) if "all" in (args.variant or ()) else args.variant or ["default"]
    results = asyncio.run(measure(variants, args.set or SETS, args.max_new_tokens, args.threads))
    machine = {
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "threads": args.threads,
        "platform": platform.platform(),
    }
    rates = {
        variant: {s: f"{r['passed']}/{r['asked']}" for s, r in sets.items()}
        for variant, sets in results.items()
    }
    print(f"cpu: {machine['cpu']} ({machine['cpu_count']} cores, {args.threads} threads)")
    for variant, by_set in rates.items():
        print(f"{variant}: " + ", ".join(f"{s} {rate}" for s, rate in by_set.items()))
    if args.out:
        record = {
            "command": "python -m bench.answers " + " ".join(argv or sys.argv[1:]),
            "machine": machine,
            "max_new_tokens": args.max_new_tokens,
            "rates": rates,
            "variants": results,
        }
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
