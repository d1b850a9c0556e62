"""``python -m bench.grammar``: llguidance, xgrammar and outlines-core on the embedded Gemma 3's
262,144-token vocabulary, against a decode step of our batched engine in the same process.

For each library: its vocabulary built from the model's tokenizer (once, timed), the response
formats of ``bench/schemas.json`` compiled and checked (``grammar_checks.py``), then rounds that
time one token's work: the mask computed into a bitmask, applied to float32 logits
``[rows, 262,144]`` (the engine's ``grammar_mask.apply_bitmask`` for all three: the bitmask
format is shared) and the token taken. One row walks every format's instance and a stop token;
8 rows walk 8 of them in lockstep, all constrained (the costly case), a row that ends starting
the next format. Each round first times the engine's decode step (``ModelRunner``'s forward,
logits and greedy pick, ``--dtype auto``) at 1 and 8 rows, and every step of the round runs at
the thread count the engine's ``auto`` picks at that moment, so a ratio compares figures of one
round. Each round another library goes first. Last, schemas a library may not compile: what it
says. Writes bench/results/grammar.json and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from wschat.server.engine.base import SamplingParams
from wschat.server.engine.local.grammar_mask import allocate_bitmask, apply_bitmask
from wschat.server.engine.local.loader import LoadedModel, load_model
from wschat.server.engine.local.runner import ModelRunner
from wschat.server.engine.local.sampling import RowSampler, pick_tokens
from wschat.server.engine.local.sequence_kv import layer_layout
from wschat.server.engine.local.threads import ThreadPolicy

from . import render
from .figures import Column, Table
from .grammar_checks import check, compile_all, ms, timed, try_compile, uncompilable
from .grammar_libs import LIBRARIES, Library, special_ids

HERE = Path(__file__).resolve().parent
SCHEMAS = HERE / "schemas.json"
OUT = HERE / "results" / "grammar.json"
WIDTHS = (1, 8)
PARTS = ("fill", "apply", "advance", "total")


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


class Decoder:
    """The batched engine's decode step over ``rows`` rows with 40 to 300 tokens of context."""

    def __init__(self, loaded: LoadedModel, rows: int) -> None:
        self.runner = ModelRunner(loaded, layer_layout(loaded), rows)
        params = SamplingParams(max_new_tokens=1)  # greedy: the cheapest pick
        self.samplers = [RowSampler(params, [], loaded.model.device) for _ in range(rows)]
        with torch.inference_mode():
            for b in range(rows):
                self.runner.kv.add()
                n = 40 + (b * 37) % 260
                self.runner.forward(torch.randint(10, 1000, (1, n)), [n], first=b)

    def step(self) -> None:
        runner = self.runner
        rows = len(self.samplers)
        saved = list(runner.kv.lengths)
        with torch.inference_mode():
            hidden = runner.forward(torch.randint(10, 1000, (rows, 1)), [1] * rows, first=0)
            pick_tokens(self.samplers, runner.logits(hidden[:, -1]))
        runner.kv.lengths[:] = saved  # the same contexts every round


class Walk:
    """A format's token ids (its instance's, then a stop token) and a matcher along them."""

    def __init__(self, lib: Library, compiled: Any, ids: list[int]) -> None:
        self.lib, self.compiled, self.ids = lib, compiled, ids
        self.restart()

    def restart(self) -> None:
        self.matcher = self.lib.matcher(self.compiled)
        self.at = 0


def timed_step(
    lib: Library,
    rows: Sequence[Walk],
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    times: dict[str, list[float]],
) -> None:
    """One decode step's grammar work for ``rows`` (row i walks ``rows[i]``): each row's mask,
    one apply over the logits, each row's next token taken; each part's time into ``times``."""
    t0 = time.perf_counter()
    for row, walk in enumerate(rows):
        lib.fill(walk.matcher, bitmask, row)
    t1 = time.perf_counter()
    apply_bitmask(logits, bitmask)
    t2 = time.perf_counter()
    for walk in rows:
        lib.advance(walk.matcher, walk.ids[walk.at])
        walk.at += 1
    t3 = time.perf_counter()
    for part, value in zip(PARTS, (t1 - t0, t2 - t1, t3 - t2, t3 - t0), strict=True):
        times[part].append(value)


def one_row(
    lib: Library,
    walks: list[Walk],
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    threads: Callable[[], int],
) -> dict[str, list[float]]:
    """Every format's instance walked on one row, token by token."""
    times: dict[str, list[float]] = {part: [] for part in PARTS}
    for walk in walks:
        walk.restart()
        while walk.at < len(walk.ids):
            threads()
            timed_step(lib, [walk], logits, bitmask, times)
    return times


def eight_rows(
    lib: Library,
    walks: list[Walk],
    steps: int,
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    threads: Callable[[], int],
) -> dict[str, list[float]]:
    """``steps`` steps of 8 constrained rows in lockstep (row i walks format i, then i + 8, ...)."""
    rows = logits.shape[0]
    order = [walks[i % len(walks)] for i in range(rows)]
    nexts = [rows + i for i in range(rows)]
    for walk in order:
        walk.restart()
    times: dict[str, list[float]] = {part: [] for part in PARTS}
    for _ in range(steps):
        threads()
        timed_step(lib, order, logits, bitmask, times)
        for row, walk in enumerate(order):
            if walk.at == len(walk.ids):  # a new request on this row (not timed)
                order[row] = walks[nexts[row] % len(walks)]
                nexts[row] += rows
                order[row].restart()
    return times


def summary(samples: list[float], steps: list[float]) -> dict[str, float]:
    step = statistics.median(steps)
    return {
        "median_us": _us(statistics.median(samples)),
        "p99_us": _us(_p99(samples)),
        "pct_of_step": round(100 * statistics.median(samples) / step, 2),
        "p99_pct_of_step": round(100 * _p99(samples) / step, 2),
    }


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.doc = json.loads(SCHEMAS.read_text())
        self.formats = self.doc["formats"]
        self.policy = ThreadPolicy()
        self.loaded = load_model("embedded")
        tokenizer = self.loaded.tokenizer
        self.vocab = int(self.loaded.model.config.vocab_size)
        self.stop_ids = list(self.loaded.model.generation_config.eos_token_id)
        self.special = torch.tensor(sorted(i for i in special_ids(tokenizer) if i < self.vocab))
        self.ids = {
            e["name"]: {
                kind: tokenizer(
                    json.dumps(e[kind], ensure_ascii=False), add_special_tokens=False
                ).input_ids
                for kind in ("valid", "invalid")
            }
            for e in self.formats
        }
        self.libs = [LIBRARIES[name]() for name in args.libraries]
        self.result: dict[str, Any] = {"libraries": {}}
        self.walks: dict[str, list[Walk]] = {}

    def threads(self) -> int:
        return self.policy.apply()

    def prepare(self, lib: Library) -> None:
        """Setup (timed), compiles (timed) and checks of one library."""
        tokenizer = self.loaded.tokenizer
        self.threads()
        _, setup_s = timed(lambda: lib.setup(tokenizer, self.vocab, self.stop_ids))
        compiled, compiles = compile_all(lib, self.formats)
        checks = {
            e["name"]: check(
                lib,
                compiled[e["name"]],
                self.ids[e["name"]],
                self.special,
                self.stop_ids,
                tokenizer,
                self.vocab,
            )
            for e in self.formats
            if e["name"] in compiled
        }
        self.result["libraries"][lib.name] = {
            **lib.about(),
            "tokenizer_setup_ms": ms(setup_s),
            "compile": compiles,
            "checks": checks,
        }
        self.walks[lib.name] = [
            Walk(lib, compiled[e["name"]], self.ids[e["name"]]["valid"] + [self.stop_ids[0]])
            for e in self.formats
            if e["name"] in compiled
        ]
        print(
            f"{lib.name}: setup {setup_s:.1f} s, compiled {len(compiled)} of {len(self.formats)}",
            flush=True,
        )

    def rounds(self) -> None:
        args, libs = self.args, self.libs
        decoders = {rows: Decoder(self.loaded, rows) for rows in WIDTHS}
        logits = {rows: torch.randn(rows, self.vocab) for rows in WIDTHS}
        bitmasks = {rows: allocate_bitmask(rows, self.vocab) for rows in WIDTHS}
        steps: dict[int, list[float]] = {rows: [] for rows in WIDTHS}
        per_token: dict[str, dict[str, list[float]]] = {
            lib.name: {part: [] for part in PARTS} for lib in libs
        }
        lockstep: dict[str, dict[str, list[float]]] = {
            lib.name: {part: [] for part in PARTS} for lib in libs
        }
        rounds: list[dict[str, Any]] = []
        for round_ in range(args.rounds):
            here: dict[str, Any] = {"load": os.getloadavg()[0]}
            step_now, used = {}, []
            for rows in WIDTHS:
                times = []
                for _ in range(args.decode_steps + 1):  # the first one warms
                    used.append(self.threads())
                    times.append(timed(decoders[rows].step)[1])
                steps[rows] += times[1:]
                step_now[rows] = statistics.median(times[1:])
                here[f"step_{rows}_ms"] = ms(step_now[rows])
            here["threads"] = sorted(set(used))
            turn = round_ % len(libs)
            for lib in libs[turn:] + libs[:turn]:
                walks = self.walks[lib.name]
                one = one_row(lib, walks, logits[1], bitmasks[1], self.threads)
                eight = eight_rows(
                    lib, walks, args.lockstep_steps, logits[8], bitmasks[8], self.threads
                )
                for part in PARTS:
                    per_token[lib.name][part] += one[part]
                    lockstep[lib.name][part] += eight[part]
                here[lib.name] = {
                    "token_pct_of_step_1": round(
                        100 * statistics.median(one["total"]) / step_now[1], 2
                    ),
                    "step8_pct_of_step_8": round(
                        100 * statistics.median(eight["total"]) / step_now[8], 2
                    ),
                }
            rounds.append(here)
            print(f"round {round_ + 1}: {json.dumps(here)}", flush=True)
        for lib in libs:
            entry = self.result["libraries"][lib.name]
            entry["one_row_per_token"] = {
                part: summary(values, steps[1]) for part, values in per_token[lib.name].items()
            }
            entry["eight_rows_per_step"] = {
                part: summary(values, steps[8]) for part, values in lockstep[lib.name].items()
            }
            entry["median_of_round_ratios"] = {
                key: statistics.median(r[lib.name][key] for r in rounds)
                for key in ("token_pct_of_step_1", "step8_pct_of_step_8")
            }
        self.result["decode_step_ms"] = {
            str(rows): {"median": ms(statistics.median(steps[rows])), "p99": ms(_p99(steps[rows]))}
            for rows in WIDTHS
        }
        self.result["rounds"] = rounds

    def refusals(self) -> None:
        cases = uncompilable(self.doc)
        for lib in self.libs:
            self.result["libraries"][lib.name]["uncompilable"] = {
                name: try_compile(lib, schema) for name, schema in cases.items()
            }
            print(f"{lib.name}: uncompilable cases done", flush=True)

    def machine(self) -> dict[str, Any]:
        return {
            "cpu": _cpu(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "precision": self.loaded.precision_name,
            "threads": self.policy.reason,
            "load_average_at_end": os.getloadavg(),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--decode-steps", type=int, default=8, help="per width and round")
    parser.add_argument("--lockstep-steps", type=int, default=48, help="8-row steps per round")
    installed = [name for name, lib in LIBRARIES.items() if lib.installed()]
    parser.add_argument(
        "--libraries",
        nargs="+",
        default=installed,
        choices=LIBRARIES,
        help="default: those installed (llguidance comes with the server extra)",
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bench = Bench(args)
    print(
        f"vocabulary {bench.vocab}, stop ids {bench.stop_ids}, {len(bench.special)} special "
        f"tokens; {bench.loaded.precision_name}",
        flush=True,
    )
    for lib in bench.libs:
        bench.prepare(lib)
    bench.rounds()
    bench.refusals()
    bench.result["machine"] = bench.machine()
    args.out.write_text(json.dumps(bench.result, indent=1, ensure_ascii=False) + "\n")
    print(render.markdown(table(bench.result)))
    os._exit(0)  # a compile still running in a daemon thread (try_compile) is left to die


TABLE = (  # printed as Markdown (render.markdown): the widths are not used
    Column("library", 0),
    Column("tokenizer setup", 0),
    Column("compile, median of formats (max)", 0),
    Column("per token, 1 row: median / p99 (% of a step)", 0),
    Column("per step, 8 rows: median / p99 (% of a step)", 0),
)


def table(result: dict[str, Any]) -> Table:
    out = Table(TABLE)
    for name, lib in result["libraries"].items():
        compiles = [c["median_ms"] for c in lib["compile"].values() if "median_ms" in c]
        one, eight = lib["one_row_per_token"]["total"], lib["eight_rows_per_step"]["total"]
        out.add(
            f"{name} {lib['version']}",
            f"{lib['tokenizer_setup_ms'] / 1000:.1f} s",
            f"{statistics.median(compiles):.1f} ms ({max(compiles):.0f})",
            f"{one['median_us']:.0f} / {one['p99_us']:.0f} µs ({one['pct_of_step']} % / "
            f"{one['p99_pct_of_step']} %)",
            f"{eight['median_us'] / 1000:.2f} / {eight['p99_us'] / 1000:.2f} ms "
            f"({eight['pct_of_step']} % / {eight['p99_pct_of_step']} %)",
        )
    steps = result["decode_step_ms"]
    out.line("")
    out.line(f"decode step: 1 row {steps['1']['median']} ms, 8 rows {steps['8']['median']} ms")
    return out


if __name__ == "__main__":
    main()
