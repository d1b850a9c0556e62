"""``python -m bench.neighbours``: what one row's sampling settings cost the rows that share its
batch, in the batched engine on the embedded Gemma 3 270M (or ``--model``).

Every mix runs eight rows of the same story prompts. Each decode pass over all eight is timed
(the runner's ``decode``: the forward and the picks), and within it the token picks of all rows
(``pick_tokens``), which is where one row's settings reach the others: a greedy row waits for the
slowest pick of its pass. The mixes run back to
back, round after round, so a busy machine affects them alike; the figures are medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from .workload import story

WIDTH = 8
SAMPLED = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "repetition_penalty": 1.3}
MIXES: dict[str, list[dict[str, Any]]] = {
    "8 greedy": [{}] * WIDTH,
    "7 greedy + 1 top-k/top-p/penalty": [{}] * 7 + [SAMPLED],
    "7 greedy + 1 flat nucleus (T=2, top_p=0.999)": [{}] * 7
    + [{"temperature": 2.0, "top_p": 0.999, "repetition_penalty": 1.3}],
    "7 greedy + 1 whole-vocabulary top_k": [{}] * 7
    + [{"temperature": 1.0, "top_k": 2**40, "top_p": 0.999}],
    "7 greedy + 1 extreme (T=1e-45, penalty 1e-300)": [{}] * 7
    + [{"temperature": 1e-45, "repetition_penalty": 1e-300}],
    "8 top-k/top-p/penalty": [SAMPLED] * WIDTH,
}


class PassClock:
    """Times the engine's full decode passes and the picks inside them."""

    def __init__(self, engine: Any) -> None:
        from wschat.server.engine.local import runner
        from wschat.server.engine.local.steps import StepKind

        self.passes: list[float] = []
        self.picks: list[float] = []
        # the runner module's names: ``pick_tokens`` is patched where the runner looks it up
        self._runner_names = vars(runner)
        self._runner = engine.runner
        self._execute, self._pick = engine.runner.execute, self._runner_names["pick_tokens"]
        self._decode = StepKind.DECODE
        self._in_full_pass = False

    def __enter__(self) -> PassClock:
        self._runner.execute = self._timed_execute
        self._runner_names["pick_tokens"] = self._timed_pick
        return self

    def __exit__(self, *exc: object) -> None:
        self._runner.execute = self._execute
        self._runner_names["pick_tokens"] = self._pick

    def _timed_execute(self, plan: Any) -> Any:
        self._in_full_pass = plan.kind is self._decode and len(plan.rows) == WIDTH
        started = time.perf_counter()
        try:
            return self._execute(plan)
        finally:
            if self._in_full_pass:
                self.passes.append(time.perf_counter() - started)
            self._in_full_pass = False

    def _timed_pick(self, samplers: Any, logits: Any) -> Any:
        started = time.perf_counter()
        picked = self._pick(samplers, logits)
        if self._in_full_pass:
            self.picks.append(time.perf_counter() - started)
        return picked


async def run_mix(
    engine: Any, prompts: list[list[int]], mix: list[dict[str, Any]], tokens: int
) -> tuple[float, float]:
    """Median seconds of a full decode pass, and of the picks in it."""
    from wschat.server.engine.base import GenerationRequest, SamplingParams

    with PassClock(engine) as clock:
        generations = [
            engine.generate(GenerationRequest(ids, SamplingParams(tokens, seed=i, **params)))
            for i, (ids, params) in enumerate(zip(prompts, mix, strict=True))
        ]
        for generation in generations:
            async for _ in generation.items():
                pass
    return statistics.median(clock.passes), statistics.median(clock.picks)


async def measure(model: str, tokens: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    from wschat.server.engine.history import Conversation
    from wschat.server.engine.local.batched import BatchedEngine
    from wschat.server.engine.local.loader import load_model
    from wschat.server.engine.local.options import LocalEngineOptions

    from .inprocess import PROMPT_FORMAT

    loaded = load_model(model)
    engine = BatchedEngine(loaded, LocalEngineOptions(width=WIDTH, prompt_format=PROMPT_FORMAT))
    conversation = Conversation(engine.prompt_format)
    prompts = [conversation.prompt_ids(conversation.tokenize_user(story(i))) for i in range(WIDTH)]
    vocabulary = engine.runner.lm_head.out_features
    print(f"{model}: {loaded.dtype} on {loaded.device}, vocabulary {vocabulary}", flush=True)
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in MIXES}
    await run_mix(engine, prompts, MIXES["8 greedy"], 4)  # warm-up
    for _ in range(rounds):
        for name, mix in MIXES.items():
            figures[name].append(await run_mix(engine, prompts, mix, tokens))
    await engine.aclose()
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.neighbours")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--tokens", type=int, default=24, help="new tokens per row")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    figures = asyncio.run(measure(args.model, args.tokens, args.rounds))
    base = statistics.median(p for p, _ in figures["8 greedy"])
    print(f"{'mix':48s} {'ms/pass':>8s} {'picks':>8s} {'vs 8 greedy':>12s}")
    for name, values in figures.items():
        full = statistics.median(p for p, _ in values)
        picks = statistics.median(k for _, k in values)
        print(f"{name:48s} {full * 1e3:8.1f} {picks * 1e3:8.1f} {full / base:11.2f}x")


if __name__ == "__main__":
    main()
