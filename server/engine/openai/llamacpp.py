"""``python -m wschat.server.engine.openai.llamacpp``: llama.cpp's server on the embedded Gemma 3
270M GGUF (or another GGUF), from the prebuilt ``xllamacpp`` wheel: no compiler, no torch.

It serves the OpenAI API the openai engine speaks, plus ``/slots``, ``/tokenize`` and
``/metrics``; it prints ``listening on URL`` once it accepts requests (``--port 0`` picks a free
port) and runs until SIGTERM or SIGINT. ``--swa-full`` keeps the full sliding-window KV, which
is what lets a conversation's next turn reuse its earlier turns (without it llama.cpp's server
keeps only the window and reprocesses most of the prompt).

A server that cannot start (a port it cannot bind, a model it cannot load) exits 1 after
llama.cpp's own error lines. ``--until-stdin-closes`` also stops it once its standard input ends:
a parent that holds the other end of that pipe and dies, even of SIGKILL, leaves no server behind
(the kernel closes the pipe). ``WSCHAT_LLAMACPP_API_KEY``, where set, is the key every request
but ``/health`` must carry (a loopback port is open to every local user and, through CORS, to
the pages of a local browser).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from .tokenizer import EMBEDDED, default_cache_dir, gguf_path

API_KEY_VARIABLE = "WSCHAT_LLAMACPP_API_KEY"


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
    parser.add_argument(
        "--cache-ram-mib",
        type=int,
        default=None,
        help="MiB of RAM for the KV of prompts no slot holds any more (default: llama.cpp's)",
    )
    parser.add_argument("--alias", default=None, help="the model name /v1/models gives")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument(
        "--verbosity", type=int, default=3, help="llama.cpp's log levels kept: 2 warnings, 3 info"
    )
    parser.add_argument(
        "--until-stdin-closes",
        action="store_true",
        help="also stop once standard input ends (the parent holding the pipe exited)",
    )
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
    if args.cache_ram_mib is not None:
        params.cache_ram_mib = args.cache_ram_mib
    params.verbosity = args.verbosity
    params.endpoint_slots = True
    params.endpoint_metrics = True
    if args.alias:
        params.model_alias = {args.alias}
    if os.environ.get(API_KEY_VARIABLE):
        params.api_keys = [os.environ[API_KEY_VARIABLE]]
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if args.until_stdin_closes:
        threading.Thread(target=_stop_at_eof, args=(stop,), daemon=True).start()
    try:
        server = xllamacpp.Server(params)
    except RuntimeError as error:  # llama.cpp has logged why
        print(f"llama.cpp's server did not start: {error}", file=sys.stderr, flush=True)
        return 1
    print(f"listening on {server.listening_address}", flush=True)
    stop.wait()
    del server
    return 0


def _stop_at_eof(stop: threading.Event) -> None:
    # the descriptor, not sys.stdin: a daemon thread blocked in a buffered read at exit holds
    # the buffer's lock, which the interpreter's shutdown then aborts on
    while os.read(0, 4096):
        pass
    stop.set()


if __name__ == "__main__":
    sys.exit(main())
