"""``python -m bench --only structured`` (and the full run): structured output and logprobs on
wschat with the embedded model, over a real server and WebSockets.

One server (``--engine batched``, ``--grammar-vocabulary start``, so the vocabulary's one build
is not timed). Three parts, every figure a ratio of two runs measured in the same rounds:

- **Replies that parse**: the 10 ``json_schema`` formats of ``bench/schemas.json``, 5 prompts
  each, greedy, 8 sessions at a time (``params.response_format``; each row its own mask), at
  most ``MAX_TOKENS`` tokens each: the share that parse as JSON and validate against their
  schema (``jsonschema``), and why each reply ended.
- **Decode with a schema against without**, at 1 and 8 sessions: each format's first prompt
  (10 alone, the first 8 at once), each run without a format for exactly the tokens its
  constrained reply took (``max_new_tokens`` of that count), so both sides decode batches of
  the same shape; each round runs both, in alternating order. The figure: the median over
  streams of ``done.timing.decode_tokens_per_s`` (1 session) and tokens over the batch's wall
  time (8 sessions), schema over none.
- **One constrained row beside plain ones**: the first 8 of those prompts at once, each for the
  tokens its constrained reply took, once with the first one's schema and the other 7 plain,
  once all 8 plain, and once all plain again (how far two like batches differ here); the
  figure: the 7 plain rows' median ``decode_tokens_per_s``, beside the schema over all plain.
- **Logprobs at one stream**: one prompt of 64 tokens with ``params.logprobs`` 5 against none,
  alternating, 8 pairs a round: the median decode rate of each, and the median of the pairs'
  ratios (the figure).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import procs, wsload
from .figures import Section, Target, at_least
from .render import figure
from .stats import median

log = logging.getLogger("bench.structured")

HERE = Path(__file__).resolve().parent
SCHEMAS = HERE / "schemas.json"
# What a schema's replies may take: none of the formats' instances is half of it, and its last
# quarter closes the JSON where the model would not (engine/grammar_close.py)
MAX_TOKENS = 160
AT_ONCE = 8  # replies asked at once, for validity (their rates are measured apart)
LOGPROB_PAIRS = 8  # a round's pairs of one-stream replies with logprobs and without
# The targets: all replies valid; a schema's decode at least 0.9x plain; logprobs at
# most 5 % slower at one stream; plain rows beside a constrained one as fast as beside plain
# ones, within what two like batches differ by on this 2-core machine (5 %)
TARGETS = {"valid": 1.0, "decode": 0.9, "logprobs": 0.95, "beside": 0.95}
# 5 prompts per format, written for what each format holds (not tuned to the model's replies)
PROMPTS: dict[str, tuple[str, ...]] = {
    "person": ("Describe a famous scientist.", "Tell me about your neighbour.",
               "Who wrote the first computer program?", "Describe a fictional detective.",
               "Introduce a person who lives in Berlin."),
    "order": ("Summarise my last online order.", "What did the customer buy?",
              "Show an order of two books.", "Describe a cancelled order.",
              "Give me the status of order 17."),
    "weather": ("What is the weather like in Oslo?", "Report the weather at noon.",
                "Describe a snowy morning.", "Give the weather for a summer evening in Rome.",
                "How windy is it on the coast?"),
    "event": ("Plan a birthday party.", "Announce a team meeting.",
              "Describe a concert next spring.", "Create an online workshop.",
              "Tell me about a local market day."),
    "classification": ("Classify this review: the food was cold and late.",
                       "Is this positive: I love my new phone!",
                       "Classify: the service was fine, nothing special.",
                       "What is the sentiment of: terrible support, never again.",
                       "Classify this comment: great value for money."),
    "shape": ("Describe a circle.", "Give me a rectangle.", "Pick any shape.",
              "What shape is a coin?", "Describe the shape of a door."),
    "recipe": ("Give me a recipe for pancakes.", "How do I make tomato soup?",
               "A recipe for a simple salad.", "How to bake bread?",
               "Write a recipe with rice."),
    "contact": ("Who should I call about the invoice?", "Give me a contact at the office.",
                "Share the phone number of a plumber.", "Add a new contact.",
                "Who is my emergency contact?"),
    "task": ("Add a task to write the report.", "Plan my Monday.",
             "What is on my to-do list?", "Create a task to clean the garage.",
             "Break the move into tasks."),
    "tool_call": ("What is the weather in Zurich?", "Is it raining in Paris?",
                  "Check the weather in Tokyo in fahrenheit.", "Weather for Madrid, please.",
                  "How cold is it in Helsinki?"),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class StructuredWork:
    rounds: int = 2  # of the decode and logprobs comparisons
    concurrency: tuple[int, ...] = (1, 8)
    logprobs: int = 5
    logprob_tokens: int = 64

    @classmethod
    def quick(cls) -> StructuredWork:
        return cls(rounds=1)


def formats() -> dict[str, dict[str, Any]]:
    """Each ``json_schema`` format of bench/schemas.json, by name."""
    spec = json.loads(SCHEMAS.read_text())["formats"]
    return {f["name"]: f["response_format"] for f in spec if f["name"] in PROMPTS}


def run(work: StructuredWork, logs: Path, engine: str) -> dict[str, Any]:
    logs.mkdir(parents=True, exist_ok=True)
    extra = ("--grammar-vocabulary", "start")
    with procs.wschat(engine, logs, 64, extra, "wschat-structured") as server:
        result = asyncio.run(_measure(work, server.ws_url))
    return {"workload": dataclasses.asdict(work), "engine": engine, **result}


async def ask(url: str, text: str, params: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """One prompt on a fresh session: its ``done`` and the seconds from the send to it."""
    async with wsload.session(url) as peer:
        return await _asked(peer, text, params)


async def _asked(peer: wsload.Peer, text: str, params: dict[str, Any]) -> tuple[Any, float]:
    sent = time.perf_counter()
    await peer.send({"type": "prompt", "id": "p", "text": text, "params": params})
    while (frame := await peer.recv())["type"] != "done":
        pass
    return frame, time.perf_counter() - sent


async def together(url: str, asks: list[tuple[str, dict[str, Any]]]) -> tuple[list[Any], float]:
    """Prompts sent at once on fresh sessions: their ``done``s and the wall time of all."""
    async with contextlib.AsyncExitStack() as stack:
        peers = [await stack.enter_async_context(wsload.session(url)) for _ in asks]
        started = time.perf_counter()
        done = await asyncio.gather(
            *(_asked(p, text, params) for p, (text, params) in zip(peers, asks, strict=True))
        )
        return [d for d, _ in done], time.perf_counter() - started


async def _measure(work: StructuredWork, url: str) -> dict[str, Any]:
    import jsonschema

    specs = formats()
    asks = [(name, text) for name in specs for text in PROMPTS[name]]
    replies: list[dict[str, Any]] = []
    for k in range(0, len(asks), AT_ONCE):
        batch = asks[k : k + AT_ONCE]
        dones, _ = await together(
            url,
            [(text, {"max_new_tokens": MAX_TOKENS, "temperature": 0,
                     "response_format": specs[name]}) for name, text in batch],
        )  # fmt: skip
        for (name, text), done in zip(batch, dones, strict=True):
            schema = specs[name]["json_schema"]["schema"]
            replies.append(judged(name, text, done, schema, jsonschema.validate))
        log.info("%d of %d replies", len(replies), len(asks))
    decode = await _decode(work, url, specs, replies)
    beside = await _beside(work, url, specs, replies)
    logprobs = await _logprobs(work, url)
    return {
        "replies": replies,
        **validity(replies),
        "decode": decode,
        "beside": beside,
        "logprobs": logprobs,
    }


def judged(
    name: str, text: str, done: dict[str, Any], schema: Any, validate: Callable[..., None]
) -> dict[str, Any]:
    """One reply: whether it parses, whether it matches its schema, why it ended."""
    tokens = done["usage"]["completion_tokens"]
    row = {"format": name, "prompt": text, "reply": done["text"], "reason": done["reason"],
           "tokens": tokens, "parses": False, "valid": False}  # fmt: skip
    try:
        value = json.loads(done["text"])
    except ValueError:
        return row
    row["parses"] = True
    try:
        validate(value, schema)
    except Exception as error:  # jsonschema's ValidationError and SchemaError
        row["why_invalid"] = str(error).splitlines()[0]
        return row
    row["valid"] = True
    return row


def validity(replies: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(replies)
    return {
        "valid_share": sum(r["valid"] for r in replies) / n,
        "parse_share": sum(r["parses"] for r in replies) / n,
        "reasons": dict(Counter(r["reason"] for r in replies)),
        "reply_tokens_median": median([r["tokens"] for r in replies]),
    }


def first_asks(
    specs: dict[str, Any], replies: list[dict[str, Any]]
) -> list[tuple[str, dict[str, Any], int]]:
    """Each format's first prompt, its format and the tokens its constrained reply took."""
    first = {r["format"]: r for r in reversed(replies)}  # each format's first reply
    return [(r["prompt"], specs[r["format"]], r["tokens"]) for r in reversed(first.values())]


async def _decode(
    work: StructuredWork, url: str, specs: dict[str, Any], replies: list[dict[str, Any]]
) -> dict[str, Any]:
    """Per concurrency, the decode rates with the schema and without, the same lengths."""
    asks = first_asks(specs, replies)
    out: dict[str, Any] = {}
    for n in work.concurrency:
        rates: dict[str, list[float]] = {"schema": [], "plain": []}
        for i in range(work.rounds):
            for mode in ("schema", "plain") if i % 2 == 0 else ("plain", "schema"):
                for k in range(0, len(asks) - n + 1, n):  # whole batches of n
                    batch = [
                        (text, {"max_new_tokens": tokens, "temperature": 0}
                         | ({"response_format": spec} if mode == "schema" else {}))
                        for text, spec, tokens in asks[k : k + n]
                    ]  # fmt: skip
                    dones, wall = await together(url, batch)
                    if n == 1:
                        rates[mode].append(dones[0]["timing"]["decode_tokens_per_s"])
                    else:
                        tokens = sum(d["usage"]["completion_tokens"] for d in dones)
                        rates[mode].append(tokens / wall)
            log.info("decode at %d: round %d of %d", n, i + 1, work.rounds)
        schema, plain = median(rates["schema"]), median(rates["plain"])
        out[str(n)] = {"schema_tokens_per_s": schema, "plain_tokens_per_s": plain,
                       "ratio": schema / plain, "samples": len(rates["schema"])}  # fmt: skip
    return out


async def _beside(
    work: StructuredWork, url: str, specs: dict[str, Any], replies: list[dict[str, Any]]
) -> dict[str, Any]:
    """The plain rows' decode rate in a batch of 8 whose first row has its schema, in one of 8
    plain rows, and in 8 plain rows again; the same lengths in each."""
    asks = first_asks(specs, replies)[:AT_ONCE]
    modes = ("beside", "plain", "again")
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    for i in range(work.rounds * 3):
        for mode in modes[i % 3 :] + modes[: i % 3]:  # each mode first in turn
            batch = [
                (text, {"max_new_tokens": tokens, "temperature": 0}
                 | ({"response_format": spec} if mode == "beside" and k == 0 else {}))
                for k, (text, spec, tokens) in enumerate(asks)
            ]  # fmt: skip
            dones, _ = await together(url, batch)
            rates[mode].append(median([d["timing"]["decode_tokens_per_s"] for d in dones[1:]]))
        log.info("beside a schema: round %d of %d", i + 1, work.rounds * 3)
    beside, plain, again = (median(rates[mode]) for mode in modes)
    return {"beside_tokens_per_s": beside, "plain_tokens_per_s": plain,
            "again_tokens_per_s": again, "ratio": beside / plain, "again_ratio": again / plain,
            "rows": len(asks) - 1, "samples": len(rates["plain"])}  # fmt: skip


async def _logprobs(work: StructuredWork, url: str) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"logprobs": [], "plain": []}
    base = {"max_new_tokens": work.logprob_tokens, "temperature": 0}
    text = "Write a long story about a lighthouse keeper."
    for i in range(work.rounds * LOGPROB_PAIRS):
        for mode in ("logprobs", "plain") if i % 2 == 0 else ("plain", "logprobs"):
            params = base | ({"logprobs": work.logprobs} if mode == "logprobs" else {})
            done, _ = await ask(url, text, params)
            rates[mode].append(done["timing"]["decode_tokens_per_s"])
    # each pair's own ratio: two replies a few seconds apart share the machine's pace, which
    # drifts by more than the 5 % asked over the minutes of the whole part
    pairs = [a / b for a, b in zip(rates["logprobs"], rates["plain"], strict=True)]
    with_, without = median(rates["logprobs"]), median(rates["plain"])
    return {"logprobs_tokens_per_s": with_, "plain_tokens_per_s": without,
            "ratio": median(pairs), "top": work.logprobs, "samples": len(pairs)}  # fmt: skip


def targets(result: dict[str, Any]) -> list[Target]:
    share = result["valid_share"]
    rows = [
        Target.judged(
            "structured replies that parse and validate (50: 10 schemas x 5)",
            value=share * 100,
            against=None,
            ratio=share,
            limit=at_least(TARGETS["valid"]),
            unit="n",
        )
    ]
    for n, row in result["decode"].items():
        rows.append(
            Target.judged(
                f"{n} session(s): decode tokens/s with a schema / without >= 0.9",
                value=row["schema_tokens_per_s"],
                against=row["plain_tokens_per_s"],
                ratio=row["ratio"],
                limit=at_least(TARGETS["decode"]),
            )
        )
    if "beside" in result:  # runs before it had no such part
        row = result["beside"]
        rows.append(
            Target.judged(
                f"8 sessions: {row['rows']} plain rows' tokens/s beside a schema / beside none"
                " >= 0.95",
                value=row["beside_tokens_per_s"],
                against=row["plain_tokens_per_s"],
                ratio=row["ratio"],
                limit=at_least(TARGETS["beside"]),
            )
        )
    lp = result["logprobs"]
    rows.append(
        Target.judged(
            "1 stream: decode tokens/s with logprobs / without >= 0.95",
            value=lp["logprobs_tokens_per_s"],
            against=lp["plain_tokens_per_s"],
            ratio=lp["ratio"],
            limit=at_least(TARGETS["logprobs"]),
        )
    )
    return rows


def report(result: dict[str, Any]) -> Section:
    out = Section(
        [
            f"structured output: wschat --engine {result['engine']}, embedded model, greedy",
            f"  {len(result['replies'])} replies: {result['valid_share']:.0%} parse and validate "
            f"({result['parse_share']:.0%} parse); ended {result['reasons']}; median "
            f"{result['reply_tokens_median']:.0f} tokens",
        ],
        targets(result),
    )
    for n, row in result["decode"].items():
        out.parts.append(
            f"  {n} session(s): {figure(row['schema_tokens_per_s'])} tokens/s with a schema, "
            f"{figure(row['plain_tokens_per_s'])} without ({row['ratio']:.2f}x)"
        )
    if "beside" in result:
        row = result["beside"]
        out.parts.append(
            f"  8 sessions, one with a schema: the {row['rows']} plain rows at "
            f"{figure(row['beside_tokens_per_s'])} tokens/s each, beside 8 plain "
            f"{figure(row['plain_tokens_per_s'])} ({row['ratio']:.2f}x; 8 plain again: "
            f"{row['again_ratio']:.2f}x)"
        )
    lp = result["logprobs"]
    out.parts.append(
        f"  1 stream, logprobs {lp['top']}: {figure(lp['logprobs_tokens_per_s'])} tokens/s "
        f"against {figure(lp['plain_tokens_per_s'])} ({lp['ratio']:.2f}x)"
    )
    return out
