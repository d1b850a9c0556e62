"""``python -m bench.gpu``: Gemma 3 12B's shape on one GPU, with random bf16 weights.

No weights are downloaded: the model is built from the real Gemma 3 12B text config
(``GEMMA3_12B``: 48 layers, hidden 3840, 16 query and 8 KV heads of 256, a 1024-token sliding
window on five layers of six) and initialised at random on the GPU, so every matrix has its real
size and a decode step reads the real 23.5 GB of weights. Replies are nonsense; their speed is
the real model's. What it measures, in the same run:

- the device's memory bandwidth (a device-to-device copy) and, from it, the weight-bandwidth
  bound: tokens/s of one stream if each step only had to read the weights once;
- the in-process ceiling: ``model.generate``, greedy, as one stream and as static batches;
- wschat's batched engine over the WebSocket (a ``wschat.server`` process serving the same
  shape, the load generator in this one) at the same session counts, as ratios to the ceiling.

The GPU machine has torch and an older transformers but no starlette, uvicorn or websockets and
no registry: ``bench/gpu.sh`` installs carried wheels first. ``--tiny`` runs the same path on
the CPU with a two-layer model of the same kind (tests/bench/test_gpu.py).

    python -m bench.gpu --tokenizer DIR [--tokens 128] [--sessions 1,8,32] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from . import render
from .figures import Column, Section, Table

log = logging.getLogger("bench.gpu")

# google/gemma-3-12b-it's text_config (its config.json), in transformers 5's spelling.
GEMMA3_12B: dict[str, Any] = {
    "vocab_size": 262208,
    "hidden_size": 3840,
    "intermediate_size": 15360,
    "num_hidden_layers": 48,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "sliding_window": 1024,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh",
    "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    },
    "bos_token_id": 2,
    "eos_token_id": [1, 106],
    "pad_token_id": 0,
}
# The same kind of model, small enough for a CPU test of the whole path.
TINY: dict[str, Any] = {
    **GEMMA3_12B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "query_pre_attn_scalar": 32,
    "sliding_window": 16,
}
SLIDING_PATTERN = 6  # every sixth layer attends to the whole context
END_IDS = (1, 106)  # <eos>, <end_of_turn>: zeroed rows, so replies run to their length
PROMPT_FORMAT = "gemma-turns"
START_TIMEOUT_S = 600.0


def layer_types(layers: int) -> list[str]:
    return [
        "full_attention" if (i + 1) % SLIDING_PATTERN == 0 else "sliding_attention"
        for i in range(layers)
    ]


def text_config(shape: dict[str, Any]) -> Any:
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(**shape, layer_types=layer_types(shape["num_hidden_layers"]))


def build(shape: dict[str, Any], tokenizer_dir: str, device: str, dtype: str) -> Any:
    """A LoadedModel of ``shape`` with random weights, made on ``device`` directly (12B
    parameters initialised on the CPU would take minutes)."""
    import torch
    from transformers import AutoTokenizer, Gemma3ForCausalLM
    from wschat.server.engine.local.loader import LoadedModel, attention_implementation
    from wschat.server.engine.local.precision import pick_precision

    torch_dtype = pick_precision(dtype, device).dtype
    torch.manual_seed(0)
    config = text_config(shape)
    attention = attention_implementation(device)
    started = time.perf_counter()
    with torch.device(device):
        model = Gemma3ForCausalLM._from_config(
            config, dtype=torch_dtype, attn_implementation=attention
        )
    with torch.no_grad():
        # transformers 5 may leave weights as allocated: give every one a value, as the
        # model's own init would (normal, std initializer_range), norms at zero (Gemma's 1 + w)
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.zero_()
            else:
                parameter.normal_(0.0, config.initializer_range)
        for token in END_IDS:
            model.model.embed_tokens.weight[token].zero_()  # tied: the output row too
    model.generation_config.eos_token_id = list(END_IDS)
    model.generation_config.pad_token_id = 0
    model.eval()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    log.info(
        "built %.2fB parameters on %s as %s (attention %s) in %.1f s",
        sum(p.numel() for p in model.parameters()) / 1e9,
        device,
        torch_dtype,
        attention,
        time.perf_counter() - started,
    )
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    name = "gemma-3-12b-shaped (random)" if shape is GEMMA3_12B else "tiny-gemma-3 (random)"
    return LoadedModel(model, tokenizer, None, name, device, torch_dtype)


def weight_bytes(model: Any) -> int:
    """Bytes a decode step reads at least once: every parameter (the tied head counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def copy_bandwidth(device: str, gib: float = 2.0, repeats: int = 10) -> float:
    """Bytes/s a device-to-device copy moves, counting bytes read and written."""
    import torch

    source = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)  # warm-up
    _sync(device)
    started = time.perf_counter()
    for _ in range(repeats):
        target.copy_(source)
    _sync(device)
    seconds = time.perf_counter() - started
    return 2 * source.numel() * repeats / seconds


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


# -- the server process ----------------------------------------------------------------------


def serve(args: argparse.Namespace) -> int:
    """``--serve``: wschat's batched engine over this process's model, served until SIGTERM."""
    from wschat.server.engine.local.batched import BatchedEngine
    from wschat.server.engine.local.options import LocalEngineOptions
    from wschat.server.runtime.serve import serve as run_server
    from wschat.server.settings import Settings

    loaded = build(_shape(args), args.tokenizer, args.device, args.dtype)
    width = max(args.sessions)
    settings = Settings(
        port=args.port,
        prompt_format=PROMPT_FORMAT,
        max_concurrent=width,
        max_new_tokens=max(1024, args.tokens),
        default_max_new_tokens=args.tokens,
        ping_interval_s=0,
        log_level="warning",
    )
    engine = BatchedEngine(
        loaded,
        LocalEngineOptions(
            width=width,
            prompt_format=PROMPT_FORMAT,
            context_tokens=settings.context_tokens,
            kv_budget_bytes=settings.kv_budget_mib << 20,
            prefill_tokens=settings.prefill_chunk_tokens,
        ),
    )
    return run_server(settings, engine)


@contextlib.contextmanager
def server(args: argparse.Namespace, logs: Path) -> Iterator[str]:
    """The ``--serve`` process on a free port; its WebSocket URL once /readyz says so."""
    from .procs import free_port, serving

    port = free_port()
    command = [sys.executable, "-m", "bench.gpu", "--serve", "--port", str(port), *_shared(args)]
    with serving(command, "/readyz", port, logs, timeout_s=START_TIMEOUT_S) as running:
        yield running.ws_url


# -- the run ---------------------------------------------------------------------------------


def _shape(args: argparse.Namespace) -> dict[str, Any]:
    return TINY if args.tiny else GEMMA3_12B


def _shared(args: argparse.Namespace) -> list[str]:
    """The options the server process takes from this one."""
    sessions = ",".join(map(str, args.sessions))
    shared = ["--tokenizer", args.tokenizer, "--device", args.device, "--dtype", args.dtype]
    shared += ["--tokens", str(args.tokens), "--sessions", sessions]
    return [*shared, "--tiny"] if args.tiny else shared


def figures(streams: list[Any], tokens: int) -> dict[str, Any]:
    """One measurement: aggregate tokens/s, TTFT and inter-token gaps, and whether every stream
    ran to its length (random weights never end a reply early: a short one is a fault)."""
    from .stats import Concurrent, median

    c = Concurrent.of(streams)
    return {
        "streams": c.streams,
        "aggregate_tps": c.aggregate,
        "stream_tps": median([s.rate for s in streams]),
        "ttft_median_s": c.ttft_median,
        "ttft_p95_s": c.ttft_p95,
        "itl_p95_s": c.itl_p95,
        "complete": all(len(s.tokens) == tokens for s in streams),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from wschat.server.engine.local.attention import choose_kernel
    from wschat.server.engine.local.hf import HFEngine
    from wschat.server.engine.local.options import LocalEngineOptions

    from .ceiling import static_batch
    from .inprocess import InProcess
    from .stats import median
    from .workload import story
    from .wsload import concurrent

    started = time.perf_counter()
    logs = Path(args.logs)
    with contextlib.ExitStack() as stack:
        url: str | None = None
        try:
            url = stack.enter_context(server(args, logs / "gpu-server.log"))
        except Exception as error:  # the ceiling is still worth measuring
            log.exception("the wschat server did not start")
            wschat_error: str | None = repr(error)
        else:
            wschat_error = None

        loaded = build(_shape(args), args.tokenizer, args.device, args.dtype)
        local = InProcess(loaded, HFEngine(loaded, LocalEngineOptions(prompt_format=PROMPT_FORMAT)))
        result: dict[str, Any] = {
            "model": loaded.name,
            "device": _device_name(args.device),
            "dtype": str(loaded.dtype).removeprefix("torch."),
            "attention": loaded.model.config._attn_implementation,
            # the kernel the batched engine's forwards take (engine/local/attention.py)
            "batched_attention": choose_kernel(loaded.model.device, loaded.dtype),
            "tokens": args.tokens,
            "weight_bytes": weight_bytes(loaded.model),
        }
        bandwidth = copy_bandwidth(args.device, gib=0.25 if args.tiny else 2.0)
        result["copy_bandwidth_bytes_s"] = bandwidth
        result["weight_bound_tps"] = bandwidth / result["weight_bytes"]
        log.info("copy bandwidth %.0f GB/s", bandwidth / 1e9)

        def texts(n: int) -> list[str]:
            return [story(i) for i in range(n)]

        def ceiling(n: int) -> list[Any]:
            model, prompts, eos, pad = local.ceiling_inputs(texts(n))
            return static_batch(model, prompts, args.tokens, eos, pad)

        def ours_at(ws_url: str) -> Callable[[int], list[Any]]:
            return lambda n: asyncio.run(concurrent(ws_url, texts(n), args.tokens))

        systems = [("ceiling", ceiling)] + ([("wschat", ours_at(url))] if url else [])
        rows: dict[str, dict[int, list[dict[str, Any]]]] = {name: {} for name, _ in systems}
        for _, measure in systems:
            measure(1)  # warm-up: kernels, allocator, the first connection
        for r in range(args.rounds):
            for n in args.sessions:
                for name, measure in systems:
                    log.info("round %d: %d sessions: %s", r + 1, n, name)
                    try:
                        rows[name].setdefault(n, []).append(figures(measure(n), args.tokens))
                    except Exception as error:  # one failure must not lose the other rows
                        log.exception("%s at %d sessions failed", name, n)
                        wschat_error = wschat_error or repr(error)
    result["error"] = wschat_error
    for name, by_n in rows.items():
        result[name] = {
            n: {
                **{
                    k: median([m[k] for m in ms])
                    for k in ("aggregate_tps", "stream_tps", "ttft_median_s", "ttft_p95_s")
                },
                "complete": all(m["complete"] for m in ms),
                "rounds": len(ms),
            }
            for n, ms in by_n.items()
        }
    result["wall_s"] = time.perf_counter() - started
    return result


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return str(torch.cuda.get_device_name())
    return f"cpu ({os.cpu_count()} cores)"


TABLE = (
    Column("sessions", 8, "n"),
    Column("ceiling tok/s", 15),
    Column("wschat tok/s", 14),
    Column("ratio", 7, ".2f"),
    Column("TTFT p50 ceil/ours ms", 23),
    Column("TTFT p95 ceil/ours ms", 23),
    Column("1 stream vs bound", 19, ".2f"),
    Column("", 0, left=True),  # a row's warning
)


def _pair_ms(ceiling: float, ours: float) -> str:
    return f"{ceiling * 1e3:.0f} /{ours * 1e3:>9.0f}"


def report(result: dict[str, Any]) -> Section:
    bound = result["weight_bound_tps"]
    table = Table(TABLE)
    for n, ceiling in result["ceiling"].items():
        ours = result.get("wschat", {}).get(n)
        if ours is None:
            table.line(f"{n:>8} {ceiling['aggregate_tps']:>14.1f}  (wschat not measured)")
            continue
        table.add(
            n,
            ceiling["aggregate_tps"],
            ours["aggregate_tps"],
            ours["aggregate_tps"] / ceiling["aggregate_tps"],
            _pair_ms(ceiling["ttft_median_s"], ours["ttft_median_s"]),
            _pair_ms(ceiling["ttft_p95_s"], ours["ttft_p95_s"]),
            ceiling["stream_tps"] / bound,
            "" if ceiling["complete"] and ours["complete"] else "  (short streams!)",
        )
    if result["error"]:
        table.line(f"error: {result['error']}")
    table.line(f"wall {result['wall_s']:.0f} s")
    return Section(
        [
            f"{result['model']} on {result['device']}, {result['dtype']}, attention "
            f"{result['attention']} (batched engine: {result.get('batched_attention', '?')}), "
            f"{result['tokens']} new tokens per stream",
            f"weights {result['weight_bytes'] / 1e9:.1f} GB; copy bandwidth "
            f"{result['copy_bandwidth_bytes_s'] / 1e9:.0f} GB/s; weight-bandwidth bound "
            f"{bound:.1f} tokens/s per stream",
            "",
            table,
        ]
    )


def _sessions(text: str) -> list[int]:
    return [int(n) for n in text.split(",") if n]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__)
    parser.add_argument("--tokenizer", required=True, help="a folder with Gemma 3's tokenizer")
    parser.add_argument("--tiny", action="store_true", help="a 6-layer model (CPU test)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", help="auto: bf16 on CUDA")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per stream")
    parser.add_argument("--sessions", type=_sessions, default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, help="where the results go")
    parser.add_argument("--logs", default="bench/logs")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.serve:
        return serve(args)
    result = run(args)
    print(render.text(report(result)), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    rows = [row for name in ("ceiling", "wschat") for row in result.get(name, {}).values()]
    failed = result["error"] or not all(row["complete"] for row in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
