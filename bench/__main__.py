"""``python -m bench``: wschat on the embedded Gemma 3 270M in a subprocess, measured against the
in-process ceiling of the same run (and optionally against ``transformers serve``).

Prints a table of figures and ratios, writes bench/results/latest.json and draws docs/bench.png.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from . import chart, report
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="shorter streams, one round")
    parser.add_argument("--no-peer", action="store_true", help="skip transformers serve")
    parser.add_argument("--engine", default="batched", help="the wschat engine measured")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "latest.json")
    parser.add_argument("--png", type=Path, default=ROOT / "docs" / "bench.png")
    parser.add_argument(
        "--logs", type=Path, default=Path(tempfile.gettempdir()) / "wschat-bench", help="logs"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from .run import run

    work = Workload.quick() if args.quick else Workload()
    started = time.monotonic()
    result = run(work, engine=args.engine, peer_wanted=not args.no_peer, logs=args.logs)
    result["machine"] = _machine()
    result["wall_s"] = time.monotonic() - started
    result["targets"] = report.targets(result)
    print(report.table(result))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"\nwrote {args.json}")
    why_not = chart.draw(result, args.png)
    print(f"no chart: {why_not}" if why_not else f"wrote {args.png}")
    print(f"{result['wall_s']:.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
