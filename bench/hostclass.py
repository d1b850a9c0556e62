"""The x86 host classes one machine can stand in for, by capping its libraries' instruction
sets through their environment variables (read once, when torch loads: so per process).

- ``amx``: the host as it is (an Intel Xeon with AMX measures as itself);
- ``avx512-bf16``: AVX512 with bf16 instructions and no AMX (recent AMD EPYC and Ryzen, Intel
  Cooper Lake): ATen's AVX512 kernels, oneDNN capped at ``AVX512_CORE_BF16``;
- ``avx2``: ATen, oneDNN, MKL and fbgemm capped at AVX2 (most laptops, older servers).

Inductor reads ``ATEN_CPU_CAPABILITY`` for its vector width; its AMX micro-kernels, which no
variable caps, serve only multiplies of 16 rows and more.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import render
from .figures import Section

AMX, AVX512_BF16, AVX2 = "amx", "avx512-bf16", "avx2"
CLASSES: dict[str, dict[str, str]] = {
    AMX: {},
    AVX512_BF16: {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
    AVX2: {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
    },
}
CAPS = sorted({name for env in CLASSES.values() for name in env})


def env_of(host_class: str) -> dict[str, str]:
    """This process's environment with ``host_class``'s caps in place of any set here."""
    env = {k: v for k, v in os.environ.items() if k not in CAPS}
    return env | CLASSES[host_class]


def available() -> list[str]:
    """The classes this machine can measure: each needs the host's instructions to be at least
    its own (an AVX2-only host measures only ``avx2``)."""
    import torch

    capabilities = torch.backends.cpu.get_cpu_capability()
    has_amx = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
    out = [AVX2] if capabilities in ("AVX2", "AVX512") else []
    if capabilities == "AVX512" and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        out.insert(0, AVX512_BF16)
    if has_amx and out[:1] == [AVX512_BF16]:
        out.insert(0, AMX)
    return out


def parse(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    child: Callable[[argparse.Namespace], dict[str, Any]],
) -> argparse.Namespace | None:
    """``parser``'s arguments, with the hidden ``--child`` that ``run_child`` passes. In a child:
    print ``child(args)``'s figures as JSON (the last line ``run_child`` reads), None; in the
    parent: its log lines set up, the arguments."""
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    return args


def run_child(host_class: str, module: str, args: list[str], timeout: float) -> dict[str, Any]:
    """Run ``python -m module args`` under ``host_class``'s caps; the JSON its last stdout line
    holds."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env_of(host_class),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{module} under {host_class} failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def interleaved(
    calls: dict[str, Any], rounds: int, repeats: int, warmup: int = 3
) -> dict[str, list[float]]:
    """Seconds per call of each of ``calls`` (name: a no-argument callable), each round taking
    every one in turn (the first rotating), ``repeats`` calls each: the median call per round."""
    import statistics
    import time

    for call in calls.values():
        for _ in range(warmup):
            call()
    names = list(calls)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                calls[name]()
                times.append(time.perf_counter() - started)
            out[name].append(statistics.median(times))
    return out


def paired_speedup(baseline: list[float], other: list[float]) -> float:
    """The median over rounds of baseline's time over ``other``'s (> 1: ``other`` is faster)."""
    import statistics

    return statistics.median(b / o for b, o in zip(baseline, other, strict=True))


def save(result: dict[str, Any], path: Path, section: Section) -> None:
    """Write ``result`` (with the load average now, and ``section``'s targets) to ``path`` as
    JSON; print ``section``."""
    result["load_average_at_end"] = os.getloadavg()
    result["targets"] = [t.as_json() for t in section.targets]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(render.text(section))
    print(f"wrote {path}")
