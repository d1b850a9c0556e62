"""Exit statuses of the ``wschat`` command, the one format its errors are printed in, and its
notices about how a reply ended."""

from __future__ import annotations

from enum import IntEnum

from wschat.protocol import Done, FinishReason, Limits

from .errors import (
    ChatError,
    ConnectError,
    ConnectionClosedError,
    NotServingYetError,
)


class ExitStatus(IntEnum):
    OK = 0
    UNEXPECTED = 1  # a bug or an error with no better status
    USAGE = 2  # bad arguments, unreadable image file
    CONNECTION = 3  # could not connect, refused handshake, connection lost, timed out
    REFUSED = 4  # the server (or the same check made locally) refused the request
    GENERATION_FAILED = 5  # the reply ended with reason "error"
    CUT = 6  # the reply of ``ask`` ended with reason "length": printed, but not whole
    INTERRUPTED = 130  # Ctrl-C stopped the reply of ``ask``


EXIT_STATUS_HELP = "\n".join(
    f"  {status.value:<4} {text}"
    for status, text in (
        (ExitStatus.OK, "the reply was printed and ended on its own"),
        (ExitStatus.UNEXPECTED, "unexpected failure"),
        (ExitStatus.USAGE, "usage error (bad arguments, unreadable image)"),
        (
            ExitStatus.CONNECTION,
            "connection failed, refused, lost or timed out; or the server still starting "
            "past --wait",
        ),
        (ExitStatus.REFUSED, "the server refused the request (an error frame: busy, ...)"),
        (ExitStatus.GENERATION_FAILED, "the reply ended with reason error"),
        (ExitStatus.CUT, "the reply was printed but cut at the length limit (ask)"),
        (ExitStatus.INTERRUPTED, "Ctrl-C stopped the reply (ask)"),
    )
)


def error_line(error: BaseException) -> str:
    """``error: <code>: <message>``, the one format every failure is reported in."""
    if isinstance(error, ChatError):
        return f"error: {error.code.value}: {error.message}"
    if isinstance(error, NotServingYetError):
        return f"error: connect: {error.message} (wait for it with --wait SECONDS)"
    if isinstance(error, ConnectError):
        return f"error: connect: {error.message}"
    if isinstance(error, ConnectionClosedError):
        return f"error: closed: {error}"
    if isinstance(error, TimeoutError):
        return "error: timeout: no answer from the server in time"
    return f"error: {type(error).__name__}: {error}"


def exit_status(error: BaseException, done: Done | None = None) -> ExitStatus:
    if isinstance(error, ChatError):
        failed = done is not None and done.reason is FinishReason.ERROR
        return ExitStatus.GENERATION_FAILED if failed else ExitStatus.REFUSED
    if isinstance(error, ConnectError | ConnectionClosedError | TimeoutError | OSError):
        return ExitStatus.CONNECTION
    return ExitStatus.UNEXPECTED


STOPPING_NOTICE = "[stopping: Ctrl-C again to leave without waiting]"
RESUMED_NOTICE = "[reconnected: the conversation was kept]"


def length_notice(done: Done, limits: Limits) -> str:
    """What cut a reply that ended with reason ``length``, and what would let it go on."""
    usage, context = done.usage, limits.context_tokens
    if usage.prompt_tokens + usage.completion_tokens >= context:
        return f"[reply cut: the conversation filled the model's {context}-token context]"
    cut, cap = usage.completion_tokens, limits.max_new_tokens
    if cut >= cap:  # the server's cap: no prompt may ask for more
        return (
            f"[reply cut at the server's {cap}-token cap: wschat-server --max-new-tokens sets it]"
        )
    # the length the prompt asked for, or the server's default for one that names none
    return f"[reply cut at the {cut}-token limit: ask for up to {cap} with --max-new-tokens]"
