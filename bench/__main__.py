"""``python -m bench``: wschat on the embedded Gemma 3 270M in a subprocess, measured against the
in-process ceiling of the same run (and optionally against ``transformers serve``).

Prints a table of figures and ratios, writes bench/results/latest.json and draws docs/bench.png.
A full run ends with the busy-neighbour scenario (bench/threads.py), the batch widths
(bench/widths.py) and image conversations (bench/images.py), which ``--quick`` leaves out;
``--only threads`` runs the first alone and writes bench/results/threads.json, ``--only widths``
and ``--only images`` the others (bench/results/<name>.json). So does the
llama.cpp scenario (bench/llamacpp.py; ``--only llamacpp``: bench/results/llamacpp.json), when
``xllamacpp`` is installed. ``--only resume`` runs the mid-reply resume scenario alone
(bench/resume.py: 20 drops, resume latency and whole replies; bench/results/resume.json).
``--only openai`` runs the OpenAI-compatible API scenario alone (bench/openai_api.py: the SDK's
streams against the WebSocket's at 1 and 8, a conversation resent whole;
bench/results/openai.json). ``--only responses`` runs the Responses API's WebSocket mode
against the msgpack WebSocket and a conversation continued on one socket (bench/responses.py;
bench/results/responses.json). ``--only openings`` runs first prompts on fresh sessions with the
conversations' shared opening and without it (bench/openings.py; bench/results/openings.json).
A full run also measures structured output and logprobs (bench/structured.py; ``--only
structured``: bench/results/structured.json) and ``n`` choices (bench/choices.py; ``--only
choices``). ``--only tools`` runs tool calls through the SDK, forced and ``auto``
(bench/tool_calls.py; bench/results/tools.json).
``--only classes`` runs our engine under each x86 class this host can stand in for (AMX,
AVX512-BF16, AVX2: bench/hostclass.py) beside llama.cpp's server (bench/classes.py;
bench/results/classes.json).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self

from . import (
    chart,
    choices,
    classes,
    images,
    llamacpp,
    openai_api,
    openings,
    render,
    report,
    responses,
    resume,
    structured,
    threads,
    tool_calls,
    widths,
)
from .figures import Section
from .workload import Workload

ROOT = Path(__file__).resolve().parent.parent


def _machine() -> dict[str, object]:
    import torch
    import transformers

    cores = os.cpu_count()
    return {
        "summary": f"{cores} CPU cores, torch {torch.__version__}",
        "cpu_count": cores,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "load_average_at_start": os.getloadavg(),
    }


class Work(Protocol):
    """A scenario's workload: ``Work()`` the full run, ``Work.quick()`` a short one."""

    @classmethod
    def quick(cls) -> Self: ...


Measure = Callable[[bool, Path, str], dict[str, Any]]  # (quick, logs, engine): the figures


class ScenarioModule(Protocol):
    """A scenario's module (bench/figures.py): what runs it, and its report of what it ran."""

    def run(self, work: Any, logs: Path, engine: str) -> dict[str, Any]: ...

    def report(self, result: dict[str, Any]) -> Section: ...


def _runs_anywhere() -> str | None:
    return None


@dataclass(frozen=True)
class Scenario:
    """A scenario ``--only NAME`` runs alone (into bench/results/NAME.json)."""

    measure: Measure
    report: Callable[[dict[str, Any]], Section]  # of the run's result: tables, text, targets
    help: str
    available: Callable[[], str | None] = _runs_anywhere  # why it cannot run here, if it cannot
    in_full_run: bool = True

    @classmethod
    def of(
        cls,
        module: ScenarioModule,
        work: type[Work],
        help: str,
        *,
        available: Callable[[], str | None] = _runs_anywhere,
        in_full_run: bool = True,
    ) -> Scenario:
        """The scenario ``module`` runs over ``work``: the full workload, or the short one
        where ``quick``."""

        def measure(quick: bool, logs: Path, engine: str) -> dict[str, Any]:
            return module.run(work.quick() if quick else work(), logs, engine)

        return cls(measure, module.report, help, available, in_full_run)


SCENARIOS = {
    "threads": Scenario.of(threads, threads.ThreadsWork, "a busy neighbour"),
    "widths": Scenario.of(widths, widths.WidthsWork, "8/16/32 sessions at batch widths 8/16/32"),
    "images": Scenario.of(
        images, images.ImagesWork, "8 conversations, half with an image in turn 1"
    ),
    "llamacpp": Scenario.of(
        llamacpp,
        llamacpp.LlamaWork,
        "llama.cpp's server direct and with wschat --engine openai in front",
        available=llamacpp.available,
    ),
    "resume": Scenario.of(
        resume, resume.ResumeWork, "replies dropped mid-stream and resumed", in_full_run=False
    ),
    "openai": Scenario.of(
        openai_api,
        openai_api.OpenAIWork,
        "streams through the openai SDK against the WebSocket; a conversation resent whole",
        available=openai_api.available,
        in_full_run=False,
    ),
    "responses": Scenario.of(
        responses,
        responses.ResponsesWork,
        "streams through the SDK's Responses WebSocket mode against the msgpack WebSocket; "
        "a conversation continued on one socket",
        available=responses.available,
        in_full_run=False,
    ),
    "openings": Scenario.of(
        openings,
        openings.OpeningsWork,
        "first prompts on fresh sessions with the shared opening and without",
        in_full_run=False,
    ),
    "choices": Scenario.of(
        choices, choices.ChoicesWork, "n = 4 choices on the HTTP API against four requests"
    ),
    "structured": Scenario.of(
        structured,
        structured.StructuredWork,
        "structured output (10 schemas x 5) and logprobs, against plain decoding",
    ),
    "tools": Scenario.of(
        tool_calls,
        tool_calls.ToolsWork,
        "tool calls through the openai SDK: required, and auto",
        available=tool_calls.available,
        in_full_run=False,
    ),
    "classes": Scenario.of(
        classes,
        classes.ClassesWork,
        "our engine under each x86 class this host can stand in for, beside llama.cpp's server",
        available=llamacpp.available,
        in_full_run=False,
    ),
}


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    """The results of the run the arguments ask for."""
    if args.only:
        scenario = SCENARIOS[args.only]
        why_not = scenario.available()
        if why_not:
            raise SystemExit(f"no {args.only} scenario: {why_not}")
        return {args.only: scenario.measure(args.quick, args.logs, args.engine)}
    from .run import run

    work = Workload.quick() if args.quick else Workload()
    result = run(work, engine=args.engine, peer_wanted=not args.no_peer, logs=args.logs)
    if not args.quick:  # --quick stays short; --quick --only NAME is the scenario's own
        for name, scenario in SCENARIOS.items():
            if scenario.in_full_run:
                why_not = scenario.available()
                result[name] = (
                    {"skipped": why_not}
                    if why_not
                    else scenario.measure(False, args.logs, args.engine)
                )
    return result


def judged(result: dict[str, Any], only: str | None) -> str:
    """Add the targets to ``result`` (of the scenario ``only``, or of a whole run); the text
    to print."""
    if only is None:
        taken = {name: s.report for name, s in SCENARIOS.items() if s.in_full_run}
        sections = report.sections(result, taken)
    else:
        sections = [SCENARIOS[only].report(result[only])]
    result["targets"] = [t.as_json() for s in sections for t in s.targets]
    return render.text(*sections)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="shorter streams, one round")
    parser.add_argument("--no-peer", action="store_true", help="skip transformers serve")
    parser.add_argument("--engine", default="batched", help="the wschat engine measured")
    parser.add_argument(
        "--only",
        choices=list(SCENARIOS),
        help="run one scenario alone: "
        + ", ".join(f"'{name}' ({s.help})" for name, s in SCENARIOS.items()),
    )
    parser.add_argument("--json", type=Path, help="where the results go (default: by scenario)")
    parser.add_argument("--png", type=Path, default=ROOT / "docs" / "bench.png")
    parser.add_argument(
        "--logs", type=Path, default=Path(tempfile.gettempdir()) / "wschat-bench", help="logs"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # SIGTERM unwinds like Ctrl-C, so every process the run started is stopped by its pid
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    started = time.monotonic()
    result = _measure(args)
    result["machine"] = _machine()
    result["wall_s"] = time.monotonic() - started
    results = ROOT / "bench" / "results"
    path = args.json or results / (f"{args.only}.json" if args.only else "latest.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    # the figures first: a run of an hour is never lost to its table
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(judged(result, args.only))
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"\nwrote {path}")
    if not args.only:
        why_not = chart.draw(result, args.png)
        print(f"no chart: {why_not}" if why_not else f"wrote {args.png}")
    print(f"{result['wall_s']:.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
