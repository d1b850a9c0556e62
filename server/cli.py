"""``wschat-server``: serve a model over ``/v1/chat``. Every option also reads ``WSCHAT_<NAME>``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from .settings import Settings

_DEFAULTS = Settings()


def _env(name: str, default: Any) -> Any:
    return os.environ.get(f"WSCHAT_{name.upper()}", default)


def _env_list(name: str) -> list[str]:
    raw = os.environ.get(f"WSCHAT_{name.upper()}", "")
    return [item.strip() for item in raw.split(",") if item.strip()]


_OPTIONS: list[tuple[str, type, str]] = [
    ("host", str, "address to listen on"),
    ("port", int, "port to listen on (0 picks a free one)"),
    (
        "model",
        str,
        "'embedded' (Gemma 3 270M shipped as a Python package), a local model "
        "folder, or a hub name on machines that have its weights",
    ),
    (
        "cache_dir",
        str,
        "where the embedded model is converted and cached "
        "(default: $XDG_CACHE_HOME/wschat or ~/.cache/wschat)",
    ),
    ("device", str, "'auto' (cuda when available, else cpu), 'cpu', 'cuda', 'cuda:1', ..."),
    (
        "dtype",
        str,
        "'auto' (bf16 where the device runs it fast, else fp32), 'bf16', 'fp32', 'fp16'",
    ),
    (
        "engine",
        str,
        "'batched': the replies of all sessions decode together, one forward pass a step; "
        "'generate': one model.generate per reply in its own thread",
    ),
    (
        "max_concurrent",
        int,
        "generations running at once across all sessions (the batched engine's batch width)",
    ),
    ("prefill_chunk_tokens", int, "prompt tokens the batched engine prefills per pass"),
    ("max_queue", int, "prompts waiting for a slot before new ones get 'overloaded'"),
    ("max_new_tokens", int, "the most tokens one reply may ask for"),
    ("default_max_new_tokens", int, "reply length when a prompt does not say"),
    ("context_tokens", int, "context window used (capped by the model's own)"),
    (
        "kv_budget_mib",
        int,
        "MiB of KV cache kept for idle sessions' next turns, text and image turns together "
        "(least recently used evicted beyond it)",
    ),
    ("max_frame_bytes", int, "largest frame accepted"),
    ("max_image_bytes", int, "largest image accepted"),
    ("max_image_pixels", int, "most pixels in one image"),
    ("max_images", int, "most images in one prompt"),
    (
        "max_session_image_bytes",
        int,
        "bytes the images one session keeps may hold (at the model's input size)",
    ),
    ("max_prompt_bytes", int, "largest prompt text, in UTF-8 bytes"),
    ("max_prompt_tokens", int, "largest prompt text, in tokens"),
    ("frames_per_second", int, "client frames per second before a connection is closed"),
    ("max_connections", int, "chat connections in total"),
    ("max_connections_per_client", int, "chat connections per client address"),
    ("idle_timeout_s", float, "close a connection with no frames and no generation this long"),
    ("ping_interval_s", float, "WebSocket keepalive ping interval (0: off)"),
    ("stall_timeout_s", float, "cancel a generation that makes no progress this long"),
    ("shutdown_grace_s", float, "on SIGTERM, how long running replies may take to finish"),
    ("resume_window_s", float, "how long a dropped session can be resumed"),
    ("log_level", str, "debug, info, warning or error"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wschat-server",
        description="Serve a Gemma 3 model over one WebSocket (/v1/chat, msgpack frames).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for name, kind, help_text in _OPTIONS:
        default = getattr(_DEFAULTS, name)
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=kind,
            help=help_text,
            default=kind(_env(name, default)) if default is not None else _env(name, None),
        )
    parser.add_argument(
        "--token",
        action="append",
        default=_env_list("tokens"),
        help="accept this bearer token (repeatable; env WSCHAT_TOKENS, "
        "comma-separated); without any, no auth is required",
    )
    parser.add_argument(
        "--allowed-origin",
        action="append",
        default=_env_list("allowed_origins"),
        help="allow browser connections from this Origin (repeatable); without "
        "any, only same-host origins and non-browser clients",
    )
    return parser


def settings_from_args(argv: Sequence[str] | None = None) -> Settings:
    args = build_parser().parse_args(argv)
    known = {f.name for f in fields(Settings)}
    values = {k: v for k, v in vars(args).items() if k in known}
    values["cache_dir"] = Path(args.cache_dir) if args.cache_dir else None
    values["tokens"] = tuple(args.token)
    values["allowed_origins"] = tuple(args.allowed_origin)
    return Settings(**values)


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from_args(argv)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from .serve import serve

    return serve(settings)


if __name__ == "__main__":
    raise SystemExit(main())
