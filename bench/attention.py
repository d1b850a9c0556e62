"""The batched engine's forward with each attention kernel this machine runs, interleaved.

``python -m bench.attention`` loads the embedded model as the server does (``--dtype auto``),
fills a ``SlotKV`` with rows of different lengths, and times, in rounds that take each kernel in
turn: a decode step at 1, 8 and 32 rows, and a prefill of one prompt. ``before`` is the model's
own attention function with masks (no ``attention.install``); ``masks`` the same through our
function; ``rows`` one SDPA call per row, no mask. Medians of each, in ms.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from wschat.server.engine.local import attention
from wschat.server.engine.local.sequence_kv import LayerLayout
from wschat.server.engine.local.slotkv import SlotKV

DECODE_WIDTHS = (1, 8, 32)
PREFILL_TOKENS = 128


def _forward(text: Any, kv: SlotKV, counts: list[int]) -> None:
    rows, width = len(counts), max(counts)
    ids = torch.randint(10, 1000, (rows, width))
    positions, masks = kv.plan(counts)
    text(
        input_ids=ids,
        attention_mask=masks,
        position_ids=positions,
        cache=kv,
        use_cache=True,
        **kv.attention_kwargs(),
    )
    kv.advance()


def _filled(layout: LayerLayout, text: Any, rows: int, kernel: str) -> SlotKV:
    """``rows`` rows of 40 to 300 tokens of context, prefilled with masks."""
    kv = SlotKV(layout, rows, kernel=attention.MASKS)
    for b in range(rows):
        kv.add()
        one = SlotKV(layout, 1, kernel=attention.MASKS)
        one.add()
        _forward(text, one, [40 + (b * 37) % 260])
        kv.transfer(one, 0, b)
    kv.kernel = kernel
    return kv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=8, help="decode steps per measurement")
    parser.add_argument("--widths", type=int, nargs="+", default=list(DECODE_WIDTHS))
    args = parser.parse_args()

    from wschat.server.engine.local.loader import load_model

    loaded = load_model("embedded")
    model = loaded.model
    inner = model.model
    text = getattr(inner, "language_model", inner)
    config = text.config
    implementation = config._attn_implementation
    original = ALL_ATTENTION_FUNCTIONS[implementation]
    attention.install(config)
    ours = ALL_ATTENTION_FUNCTIONS[implementation]
    layout = LayerLayout.of(config, loaded.dtype, model.device)
    print(f"device {model.device}, dtype {loaded.dtype}, attention {implementation}")

    kernels = {"before": attention.MASKS, "masks": attention.MASKS, "rows": attention.ROWS}
    times: dict[tuple[str, str], list[float]] = {}
    with torch.inference_mode():
        caches = {
            (name, rows): _filled(layout, text, rows, kernel)
            for name, kernel in kernels.items()
            for rows in args.widths
        }
        names = list(kernels)
        for round_ in range(args.rounds):
            # each round starts with another kernel: none always runs on a machine just warmed
            for name in names[round_ % 3 :] + names[: round_ % 3]:
                kernel = kernels[name]
                used = original if name == "before" else ours
                AttentionInterface.register(implementation, used)
                for rows in args.widths:
                    kv = caches[(name, rows)]
                    saved = list(kv.lengths)
                    start = time.perf_counter()
                    for _ in range(args.steps):
                        _forward(text, kv, [1] * rows)
                    elapsed = (time.perf_counter() - start) / args.steps
                    kv.lengths[:] = saved  # the same contexts every round
                    times.setdefault((name, f"decode x{rows}"), []).append(elapsed)
                if kernel == attention.ROWS:
                    continue  # no mask-free prefill on the CPU
                kv = SlotKV(layout, 1, kernel=kernel)
                kv.add()
                start = time.perf_counter()
                _forward(text, kv, [PREFILL_TOKENS])
                times.setdefault((name, f"prefill {PREFILL_TOKENS}"), []).append(
                    time.perf_counter() - start
                )
        AttentionInterface.register(implementation, ours)
    cases = [f"decode x{rows}" for rows in args.widths] + [f"prefill {PREFILL_TOKENS}"]
    print(f"{'ms (median)':<14}" + "".join(f"{name:>10}" for name in kernels))
    for case in cases:
        cells = [times.get((name, case)) for name in kernels]
        row = "".join(f"{statistics.median(c) * 1000:>10.2f}" if c else f"{'-':>10}" for c in cells)
        print(f"{case:<14}{row}")


if __name__ == "__main__":
    main()
