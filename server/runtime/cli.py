"""``wschat-server``: serve a model over ``/v1/chat``. Every option also reads ``WSCHAT_<NAME>``."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import textwrap
from collections.abc import Callable, Collection, Sequence
from dataclasses import Field, fields
from pathlib import Path
from typing import Any, NoReturn

from ..engine.formats import FORMATS
from ..settings import DTYPES, ENGINE_DIALECTS, GRAMMAR_VOCABULARY, STORE_SCHEMES, Settings
from .engines import ENGINE_KINDS
from .extras import missing_modules

_DEFAULTS = Settings()

LOG_LEVELS = ("debug", "info", "warning", "error")

EPILOG = """\
Every option can also be set in the environment as WSCHAT_<NAME>, the option's name in
capitals with '_' for '-' (the command line wins); --token and --allowed-origin read
comma-separated lists from WSCHAT_TOKENS and WSCHAT_ALLOWED_ORIGINS. For example:

  WSCHAT_PORT=9000 WSCHAT_MAX_CONCURRENT=4 wschat-server --log-level debug
"""


def _env(name: str, default: Any) -> Any:
    """``WSCHAT_<NAME>`` as a string when set: argparse converts a string default with the
    option's ``type``, so a bad value ends in a usage error like a bad argument."""
    return os.environ.get(f"WSCHAT_{name.upper()}", default)


def _count_or_auto(value: str, what: str, env: str) -> int | None:
    """'auto' (None) or a whole number of ``what``, 1 or more."""
    if value.strip().lower() == "auto":
        return None
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(
            f"expected 'auto' or a whole number of {what}, 1 or more "
            f"(from the flag or {env}); got {value!r}"
        )
    return count


def thread_count(value: str) -> int | None:
    """``--threads``: 'auto' (None) or a whole number of threads, 1 or more."""
    return _count_or_auto(value, "threads", "WSCHAT_THREADS")


def concurrency(value: str) -> int | None:
    """``--max-concurrent``: 'auto' (None) or a whole number of generations, 1 or more."""
    return _count_or_auto(value, "generations", "WSCHAT_MAX_CONCURRENT")


def at_least_one(value: str) -> int:
    """A whole number, 1 or more (a bound on work at once: 0 would let nothing through)."""
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number, 1 or more; got {value!r}")
    return count


def session_store(value: str) -> str:
    """``--session-store``: 'memory' or a Redis URL."""
    if value == "memory" or value.startswith(STORE_SCHEMES):
        return value
    raise argparse.ArgumentTypeError(
        f"expected 'memory' or a URL starting {', '.join(STORE_SCHEMES)} (from the flag or "
        f"WSCHAT_SESSION_STORE); got {value.split('://')[0]!r}"
    )


DEVICES = ("auto", "cpu", "cuda", "cuda:N")


def device(value: str) -> str:
    """``--device``: refused when the arguments are read (a bad name used to fail after the
    model had loaded); whether this machine has the device is checked before loading."""
    if value in DEVICES[:3] or re.fullmatch(r"cuda:\d+", value):
        return value
    raise argparse.ArgumentTypeError(
        f"invalid choice: {value!r} (choose from {', '.join(DEVICES)})"
    )


def port(value: str) -> int:
    """``--port``: 0 (a free one) to 65535."""
    try:
        number = int(value)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535; got {value!r}")
    return number


def _env_list(name: str) -> list[str]:
    raw = os.environ.get(f"WSCHAT_{name.upper()}", "")
    return [item.strip() for item in raw.split(",") if item.strip()]


# The options whose values a parser of their own checks; the rest are read as their field's type.
_PARSERS: dict[str, Callable[[str], Any]] = {
    "port": port,
    "device": device,
    "max_concurrent": concurrency,
    "threads": thread_count,
    "session_store": session_store,
    "max_replays": at_least_one,
    "max_image_checks": at_least_one,
    "log_level": str.lower,
}
# The repeatable options: a field of several values, its flag named for one of them
_LIST_FLAGS = {
    "tokens": "token",
    "allowed_origins": "allowed_origin",
    "allowed_hosts": "allowed_host",
    "forwarded_allow_ips": "forwarded_allow_ips",
}


def _parser_of(setting: Field[Any]) -> Callable[[str], Any]:
    """How the option's string becomes the setting's value: its own parser, else its type's."""
    if setting.name in _PARSERS:
        return _PARSERS[setting.name]
    kind = str(setting.type).removesuffix(" | None")  # the annotation, as a string
    return {"int": int, "float": float}.get(kind, str)


def help_text(meaning: str) -> str:
    """A setting's meaning as ``--help`` prints it: ``--name`` bare, other code in quotes, and
    argparse's ``%`` escaped."""
    text = re.sub(r"`(--[^`]+)`", r"\1", meaning)
    return re.sub(r"`([^`]+)`", r"'\1'", text).replace("%", "%%")


# --help's sections, in order; each option in one (a test checks)
_GROUPS: dict[str, tuple[str, ...]] = {
    "model and engine": (
        "model",
        "cache_dir",
        "device",
        "dtype",
        "engine",
        "engine_url",
        "engine_dialect",
        "engine_model",
        "engine_api_key",
        "engine_images",
        "tokenizer",
        "prompt_format",
        "threads",
    ),
    "replies": (
        "max_concurrent",
        "max_queue",
        "max_new_tokens",
        "default_max_new_tokens",
        "context_tokens",
        "prefill_chunk_tokens",
        "kv_budget_mib",
        "shared_openings",
        "grammar_vocabulary",
        "stall_timeout_s",
    ),
    "sessions and limits": (
        "max_frame_bytes",
        "max_image_bytes",
        "max_image_pixels",
        "max_images",
        "max_session_image_bytes",
        "max_image_checks",
        "max_prompt_bytes",
        "max_prompt_tokens",
        "max_messages",
        "responses_kept",
        "responses_kept_mib",
        "responses_kept_s",
        "frames_per_second",
        "max_connections",
        "max_connections_per_client",
        "idle_timeout_s",
        "send_timeout_s",
        "resume_window_s",
        "resume_grace_s",
        "max_replays",
    ),
    "network and security": (
        "host",
        "port",
        "tokens",
        "allowed_origins",
        "allowed_hosts",
        "forwarded_allow_ips",
        "ping_interval_s",
        "handshake_timeout_s",
        "body_timeout_s",
        "max_pending_handshakes",
        "max_pending_handshakes_per_client",
    ),
    "replicas and shutdown": ("session_store", "session_lease_s", "shutdown_grace_s"),
    "logging": ("log_level",),
}
# read from the environment after parsing, so --help never shows them (a URL may hold a password)
_SECRET_OPTIONS = frozenset({"engine_api_key", "session_store"})
_CHOICES: dict[str, Collection[str]] = {
    "dtype": DTYPES,
    "engine": ENGINE_KINDS,  # its names, read as the parser is built: a new kind is one entry
    "engine_dialect": ENGINE_DIALECTS,
    "prompt_format": FORMATS,
    "grammar_vocabulary": GRAMMAR_VOCABULARY,
    "log_level": LOG_LEVELS,
}


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Appends each option's default, except a None (its help says what it means) or a list (the
    tokens are secrets); prints the epilog as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or isinstance(action.default, list):
            return action.help
        return super()._get_help_string(action)

    def _split_lines(self, text: str, width: int) -> list[str]:
        # argparse's own wrap, but an option named in a help text is never split at a hyphen
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


HELP_HINT = "Run 'wschat-server --help' for the options."


class _Parser(argparse.ArgumentParser):
    """A usage error is its one line and a pointer to --help: the full usage is 40 options."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n{HELP_HINT}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="wschat-server",
        usage="%(prog)s [options]",  # argparse's own lists every option: 40 lines
        description="Serve a Gemma 3 model over one WebSocket (/v1/chat, msgpack frames).",
        epilog=EPILOG,
        formatter_class=_HelpFormatter,
    )
    groups = {title: parser.add_argument_group(title) for title in _GROUPS}
    group = {name: groups[title] for title, names in _GROUPS.items() for name in names}
    for setting in fields(Settings):
        name, meaning = setting.name, help_text(setting.metadata["help"])
        if name in _LIST_FLAGS:
            group[name].add_argument(
                f"--{_LIST_FLAGS[name].replace('_', '-')}",
                action="append",
                default=_env_list(name),
                help=meaning,
            )
            continue
        group[name].add_argument(
            f"--{name.replace('_', '-')}",
            type=_parser_of(setting),
            choices=_CHOICES.get(name),
            help=meaning,
            # a secret is read from the environment after parsing, so --help never shows it
            default=None if name in _SECRET_OPTIONS else _env(name, getattr(_DEFAULTS, name)),
        )
    return parser


def _check_env_choices(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """argparse checks ``choices`` on the command line only, not on a ``WSCHAT_*`` default."""
    for name, choices in _CHOICES.items():
        if getattr(args, name) not in choices:
            parser.error(
                f"WSCHAT_{name.upper()}: invalid choice {getattr(args, name)!r} "
                f"(choose from {', '.join(choices)})"
            )


def settings_from_args(argv: Sequence[str] | None = None) -> Settings:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_env_choices(parser, args)
    known = {f.name for f in fields(Settings)}
    values = {k: v for k, v in vars(args).items() if k in known}
    values["cache_dir"] = Path(args.cache_dir) if args.cache_dir else None
    values["engine_api_key"] = args.engine_api_key or _env("engine_api_key", None) or None
    try:
        values["session_store"] = session_store(
            args.session_store or _env("session_store", _DEFAULTS.session_store)
        )
    except argparse.ArgumentTypeError as e:
        parser.error(str(e))
    values["tokens"] = tuple(args.token)
    values["allowed_origins"] = tuple(args.allowed_origin)
    values["allowed_hosts"] = tuple(args.allowed_host)
    values["forwarded_allow_ips"] = tuple(
        ip.strip() for item in args.forwarded_allow_ips for ip in item.split(",") if ip.strip()
    )
    settings = Settings(**values)
    if (problem := _settings_problem(settings)) is not None:
        parser.error(problem)
    return settings


def _settings_problem(settings: Settings) -> str | None:
    """What can be refused before anything loads: values that contradict each other, and a path
    where nothing is."""
    if settings.default_max_new_tokens > settings.max_new_tokens:
        return (
            f"--default-max-new-tokens {settings.default_max_new_tokens} is more than "
            f"--max-new-tokens {settings.max_new_tokens}, the most a prompt may ask for"
        )
    model, local = settings.model, ENGINE_KINDS[settings.engine].local
    if local and model != "embedded":
        path = Path(model).expanduser()
        # the loader's rule (engine/local/loader.py resolve_model): a spec that is absolute or
        # starts '.' or '~' names a folder, never a hub name
        if (path.is_absolute() or model.startswith((".", "~"))) and not path.is_dir():
            return f"--model {model}: no model folder at {path}"
    tokenizer = settings.tokenizer
    gateway = not local and tokenizer != "embedded"
    if gateway and not Path(tokenizer).expanduser().exists():
        return f"--tokenizer {tokenizer}: no such file or folder"
    return None


def quiet_progress_bars() -> None:
    """No progress bars from transformers, the hub or tqdm: their carriage-return lines ran into
    the log lines while the first start converts the GGUF (the loader logs its own progress).
    transformers' GGUF reader calls tqdm itself, past its own switch, and tqdm reads
    TQDM_DISABLE once, as it is imported: so this runs before anything imports it."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def main(argv: Sequence[str] | None = None) -> int:
    quiet_progress_bars()
    settings = settings_from_args(argv)
    kind = ENGINE_KINDS[settings.engine]
    missing = missing_modules(kind.modules)
    if missing:  # a client-only install: one line that says what to install, no traceback
        print(kind.missing_extras(missing), file=sys.stderr)
        return 2
    for check in kind.checks:
        if (problem := check(settings)) is not None:
            print(f"wschat-server: {problem}", file=sys.stderr)
            return 2
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from .serve import serve

    return serve(settings)


if __name__ == "__main__":
    raise SystemExit(main())
