"""``python -m wschat.server.runtime.llamacpp``: llama.cpp's server on the embedded Gemma 3
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

from ..engine.embedded import EMBEDDED, default_cache_dir
from ..engine.openai.tokenizer import gguf_path

API_KEY_VARIABLE = "WSCHAT_LLAMACPP_API_KEY"
CACHE_DIR_VARIABLE = (
    "WSCHAT_CACHE_DIR"  # wschat-server's --cache-dir, as Dockerfile.gateway sets it
)


EMBEDDED_ALIAS = "gemma-3-270m (embedded, GGUF Q4_K_M)"
DESCRIPTION = (
    "llama.cpp's server (the xllamacpp wheel, no torch) on the embedded Gemma 3 270M GGUF or "
    "another GGUF, serving the OpenAI API that `wschat-server --engine openai --engine-url "
    "http://HOST:PORT/v1` speaks to. Prints `listening on URL` once it accepts requests; runs "
    f"until SIGTERM or SIGINT. {API_KEY_VARIABLE}, where set, is the key every request but "
    "/health must carry."
)


def model_alias(model: str) -> str:
    """The name /v1/models gives (and wschat's greeting shows): a GGUF file's stem, not its
    path, which would name the machine's directories to every client."""
    return EMBEDDED_ALIAS if model == EMBEDDED else Path(model).stem


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m wschat.server.runtime.llamacpp",
        description=DESCRIPTION,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", default=EMBEDDED, help="'embedded' or a .gguf file")
    parser.add_argument("--host", default="127.0.0.1", help="listening address")
    parser.add_argument(
        "--port", type=int, default=8080, help="listening port (0 picks a free one)"
    )
    parser.add_argument("--threads", type=int, default=1, help="CPU threads that decode")
    parser.add_argument("--parallel", type=int, default=4, help="slots: requests at once")
    parser.add_argument(
        "--ctx", type=int, default=8192, help="KV tokens in all; each slot gets ctx / parallel"
    )
    parser.add_argument(
        "--swa-full",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep Gemma's whole sliding-window KV, so a next turn reuses the earlier ones",
    )
    parser.add_argument(
        "--cache-ram-mib",
        type=int,
        default=argparse.SUPPRESS,
        help="MiB of RAM for the KV of prompts no slot holds any more (default: llama.cpp's)",
    )
    parser.add_argument(
        "--slot-dir",
        type=Path,
        default=argparse.SUPPRESS,
        help="a folder for the slots' save, restore and erase actions (POST /slots/ID?action=); "
        "without it llama.cpp refuses them",
    )
    parser.add_argument(
        "--alias",
        default=argparse.SUPPRESS,
        help=f"the model name /v1/models gives (default: {EMBEDDED_ALIAS} for the embedded "
        "model, a GGUF file's name without .gguf)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=argparse.SUPPRESS,
        help=f"where the embedded GGUF is unpacked (default: ${CACHE_DIR_VARIABLE} as for "
        "wschat-server, else $XDG_CACHE_HOME/wschat or ~/.cache/wschat)",
    )
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
    cache_dir = (
        getattr(args, "cache_dir", None)
        or os.environ.get(CACHE_DIR_VARIABLE)
        or default_cache_dir()
    )
    model = gguf_path(Path(cache_dir)) if args.model == EMBEDDED else args.model
    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.hostnames = [args.host]
    params.port = args.port
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx
    params.swa_full = args.swa_full
    if hasattr(args, "cache_ram_mib"):
        params.cache_ram_mib = args.cache_ram_mib
    if hasattr(args, "slot_dir"):
        params.slot_save_path = str(args.slot_dir)
    params.verbosity = args.verbosity
    params.endpoint_slots = True
    params.endpoint_metrics = True
    params.model_alias = {getattr(args, "alias", None) or model_alias(args.model)}
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
    # one write, its end of line included: in a terminal shared with llama.cpp's log (stderr),
    # a second write for the end of line let a llama.cpp line in between
    sys.stdout.write(f"listening on {server.listening_address}\n")
    sys.stdout.flush()
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
