"""``python -m wschat.server.engine.openai.llamacpp``: llama.cpp's server on the embedded Gemma 3
270M GGUF (or another GGUF), from the prebuilt ``xllamacpp`` wheel: no compiler, no torch.

It serves the OpenAI API the openai engine speaks, plus ``/slots``, ``/tokenize`` and
``/metrics``; it prints ``listening on URL`` once it accepts requests (``--port 0`` picks a free
port) and runs until SIGTERM or SIGINT. ``--swa-full`` keeps the full sliding-window KV, which
is what lets a conversation's next turn reuse its earlier turns (without it llama.cpp's server
keeps only the window and reprocesses most of the prompt).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from .tokenizer import EMBEDDED, default_cache_dir, gguf_path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m wschat.server.engine.openai.llamacpp")
    parser.add_argument("--model", default=EMBEDDED, help="'embedded' or a .gguf file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads that decode")
    parser.add_argument("--parallel", type=int, default=4, help="slots: requests at once")
    parser.add_argument(
        "--ctx", type=int, default=8192, help="KV tokens in all; each slot gets ctx / parallel"
    )
    parser.add_argument("--swa-full", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--alias", default=None, help="the model name /v1/models gives")
    parser.add_argument("--cache-dir", type=Path, default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import xllamacpp

    args = build_parser().parse_args(argv)
    model = (
        gguf_path(args.cache_dir or default_cache_dir()) if args.model == EMBEDDED else args.model
    )
    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.hostnames = [args.host]
    params.port = args.port
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx
    params.swa_full = args.swa_full
    params.endpoint_slots = True
    params.endpoint_metrics = True
    if args.alias:
        params.model_alias = {args.alias}
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server = xllamacpp.Server(params)
    print(f"listening on {server.listening_address}", flush=True)
    stop.wait()
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
