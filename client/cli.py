"""The ``wschat`` command: ``wschat chat`` (interactive) and ``wschat ask "question"``.

Both take ``--url`` (``wschat chat URL``, the older spelling, still works) and wait for a server
still starting (not listening yet, or its model loading), for up to ``--wait`` seconds, saying
so every ``WSCHAT_WAIT_NOTICE_S`` seconds (waiting.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from wschat.protocol import Done, FinishReason

from .errors import ClientError
from .local import local_params
from .opening import connect
from .repl import chat_session
from .reply import Reply
from .status import (
    EXIT_STATUS_HELP,
    STOPPING_NOTICE,
    ExitStatus,
    error_line,
    exit_status,
    length_notice,
)
from .waiting import DEFAULT_EVERY_S, WaitingNotices

DEFAULT_URL = "ws://127.0.0.1:8000/v1/chat"
# Long enough for a first start, which converts the embedded model (minutes on a busy 2-core
# machine). Only a server starting is waited for (a failed load closes 1011, a wrong path is a
# 404), and the first waiting line names the URL and says when no server ever answered there,
# so a wrong port shows at once.
DEFAULT_WAIT_S = 600.0


def sampling_params(args: argparse.Namespace) -> dict[str, Any]:
    pairs = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
    return {key: value for key, value in pairs.items() if value is not None}


def stats_line(done: Done) -> str:
    t = done.timing
    ttft = "-" if t.ttft_ms is None else f"{t.ttft_ms:.1f}"
    return (
        f"ttft_ms={ttft} tokens_per_s={t.decode_tokens_per_s:.1f} "
        f"prompt_tokens={done.usage.prompt_tokens} "
        f"completion_tokens={done.usage.completion_tokens} "
        f"cached_tokens={done.usage.cached_tokens} total_ms={t.total_ms:.1f}"
    )


def _interrupt(reply: Reply, err: TextIO) -> Callable[[], None]:
    """Ctrl-C stops the reply; a second one, before its ``done`` arrives, stops waiting."""
    task = asyncio.current_task()
    assert task is not None
    stopping = False

    def on_sigint() -> None:
        nonlocal stopping
        if stopping:
            task.cancel()
        else:
            stopping = True
            reply.cancel()
            print(STOPPING_NOTICE, file=err, flush=True)

    return on_sigint


async def ask(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    try:
        images = [Path(path).read_bytes() for path in args.image]
    except OSError as e:
        print(f"error: usage: cannot read image {e.filename}: {e.strerror}", file=err)
        return ExitStatus.USAGE
    reply = None
    waiting = WaitingNotices(args.url, args.wait, err, args.wait_notice_s)
    try:
        params = sampling_params(args)
        local_params(params)  # a bad value fails here, before any connection
        async with connect(
            args.url,
            token=args.token,
            timeout=args.timeout,
            reply_timeout=args.timeout,
            load_wait=args.wait,
            on_waiting=waiting.notice,
        ) as chat:
            waiting.stop(answered=True)
            if args.system is not None:
                await chat.configure(system=args.system)
            reply = chat.prompt(args.question, images=images, **params)
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGINT, _interrupt(reply, err))
            try:
                async for piece in reply:
                    out.write(piece)
                    out.flush()
            except asyncio.CancelledError:  # a second Ctrl-C: leave without waiting for the stop
                out.write("\n")
                return ExitStatus.INTERRUPTED
            finally:
                loop.remove_signal_handler(signal.SIGINT)
            out.write("\n")
            out.flush()
            assert reply.done is not None
            if args.stats:
                print(stats_line(reply.done), file=err)
            if reply.done.reason is FinishReason.CANCELLED:
                print("[stopped]", file=err)
                return ExitStatus.INTERRUPTED
            if reply.done.reason is FinishReason.LENGTH:
                print(length_notice(reply.done, chat.limits), file=err)
                return ExitStatus.CUT
            return ExitStatus.OK
    except (ClientError, TimeoutError, OSError) as error:
        if reply is not None and reply.tokens:
            out.write("\n")
            out.flush()
        print(error_line(error), file=err)
        return exit_status(error, reply.done if reply is not None else None)
    finally:
        waiting.stop()


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"WSCHAT_{name}") or default


def seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also refuses nan
        raise ValueError(text)
    return value


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        help=f"server URL (env WSCHAT_URL, default {DEFAULT_URL})",
    )
    parser.add_argument(
        "--wait",
        type=seconds,
        default=_env("WAIT", f"{DEFAULT_WAIT_S:g}"),
        metavar="SECONDS",
        help="while the server starts (not listening yet, or its model loading), keep trying "
        "for this long "
        f"(env WSCHAT_WAIT, default {DEFAULT_WAIT_S:g}; 0: do not wait)",
    )
    parser.add_argument(
        "--token",
        default=_env("TOKEN"),
        help="bearer token for a server started with tokens (env WSCHAT_TOKEN)",
    )
    parser.add_argument("--system", help="system prompt for the conversation")
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        help="cap on generated tokens per reply (default: the server's); a reply cut there "
        "is followed by a notice on stderr",
    )
    parser.add_argument("--temperature", type=float, help="0 (greedy, the default) to 2")
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds to wait for the connection, each answer and each reply piece (default 60)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wschat",
        description="Chat with a wschat server over its WebSocket.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit statuses:\n" + EXIT_STATUS_HELP,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chat = commands.add_parser(
        "chat",
        help="interactive chat (Ctrl-C stops a reply, Ctrl-C or Ctrl-D at the prompt quits)",
        description="Interactive chat; type /help for the commands.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit statuses:\n" + EXIT_STATUS_HELP,
    )
    # ``wschat chat URL``: the spelling before --url, kept working for scripts that use it.
    chat.add_argument("positional_url", nargs="?", metavar="URL", help=argparse.SUPPRESS)
    _add_common(chat)
    one_shot = commands.add_parser(
        "ask",
        help="ask one question, print the streamed reply and exit",
        description="Ask one question and print the reply as it streams.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit statuses:\n" + EXIT_STATUS_HELP,
    )
    one_shot.add_argument("question", help="the prompt text")
    one_shot.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="PATH",
        help="attach an image file (repeatable; the model must read images)",
    )
    one_shot.add_argument(
        "--stats", action="store_true", help="print time to first token and tokens/s to stderr"
    )
    _add_common(one_shot)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    given = getattr(args, "positional_url", None)
    if given is not None and args.url is not None:
        parser.error("give the server URL once, as --url URL")
    args.url = args.url or given or _env("URL", DEFAULT_URL)
    # how often a wait says it still waits: tests make it short, no option is worth it
    every = _env("WAIT_NOTICE_S", f"{DEFAULT_EVERY_S:g}")
    try:
        args.wait_notice_s = seconds(every or "") or DEFAULT_EVERY_S  # 0: no pause, so not 0
    except ValueError:
        parser.error(f"WSCHAT_WAIT_NOTICE_S must be a number of seconds, not {every!r}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.command == "ask":
            return asyncio.run(ask(args))
        return asyncio.run(
            chat_session(
                args.url,
                token=args.token,
                timeout=args.timeout,
                system=args.system,
                params=sampling_params(args),
                load_wait=args.wait,
                wait_notice_s=args.wait_notice_s,
            )
        )
    except KeyboardInterrupt:  # before the reply's own handler was in place
        return ExitStatus.INTERRUPTED if args.command == "ask" else ExitStatus.OK
