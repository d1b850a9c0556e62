"""``wschat chat``: the interactive loop.

Each reply streams to stdout piece by piece. Ctrl-C while a reply streams sends ``cancel`` and
prints ``[stopped]`` once its ``done`` arrives; a second Ctrl-C before then, Ctrl-C at the prompt
and end of input leave with status 0. A reply cut at the length limit is followed by a notice
and the chat goes on. Notices and errors go to stderr.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO, TypeVar

from wschat.protocol import FinishReason, GoAway

from .api import Chat
from .errors import ChatError, ClientError, ConnectionClosedError
from .opening import connect
from .reply import Reply
from .status import (
    STOPPING_NOTICE,
    ExitStatus,
    error_line,
    exit_status,
    length_notice,
    waiting_notice,
)

T = TypeVar("T")

HELP = """\
commands:
  /reset          forget the conversation (the system prompt stays)
  /system TEXT    set the system prompt and start afresh (/system alone clears it)
  /image PATH     attach an image to the next message
  /help           this list
  /quit           leave (so do Ctrl-D and Ctrl-C at the prompt)
Ctrl-C while a reply streams stops it. Start a message with // to send one beginning with /."""

Command = Callable[[str], Awaitable[int | None]]


class StdinLines:
    """Lines of standard input, read by a daemon thread so the event loop never waits on it.

    It reads the descriptor with ``os.read`` rather than ``sys.stdin``: a daemon thread blocked
    inside ``sys.stdin``'s buffer would hold its lock while the interpreter shuts down.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int = 0) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()  # None: end of input
        self._loop = loop
        self._fd = fd
        threading.Thread(target=self._run, name="wschat-stdin", daemon=True).start()

    def _run(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = ""
        try:
            while chunk := os.read(self._fd, 65536):
                *lines, pending = (pending + decoder.decode(chunk)).split("\n")
                for line in lines:
                    self._put(line.removesuffix("\r"))
            pending += decoder.decode(b"", final=True)
            if pending:
                self._put(pending)
        except OSError:
            pass
        finally:
            self._put(None)

    def _put(self, item: str | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads any more
            self._loop.call_soon_threadsafe(self.queue.put_nowait, item)


class Repl:
    def __init__(
        self, chat: Chat, lines: asyncio.Queue[str | None], out: TextIO, err: TextIO
    ) -> None:
        self.chat = chat
        self.lines = lines
        self.out = out
        self.err = err
        self.interactive = sys.stdin.isatty()
        self.reply: Reply | None = None  # the reply streaming now; Ctrl-C stops it
        self.stopping = False  # a cancel for ``reply`` is on its way
        self.quit = asyncio.Event()  # set by Ctrl-C at the prompt or a second Ctrl-C
        self.commands: dict[str, Command] = {
            "/reset": self._reset,
            "/system": self._system,
            "/image": self._image,
            "/help": self._help,
            "/quit": self._leave,
        }

    def on_sigint(self) -> None:
        reply = self.reply
        if reply is None or reply.finished or self.stopping:
            self.quit.set()
        else:
            self.stopping = True
            reply.cancel()
            self._notice(STOPPING_NOTICE)

    async def run(self) -> int:
        while (line := await self._next_line()) is not None:
            try:
                status = await self._handle(line.strip())
            except ConnectionClosedError as error:
                self._notice(error_line(error))
                return ExitStatus.CONNECTION
            except (ChatError, TimeoutError) as error:
                self._notice(error_line(error))
                status = None
            if status is not None:
                return status
        if self.interactive:
            self._write("\n")
        return ExitStatus.OK

    async def _next_line(self) -> str | None:
        if self.interactive:
            self._write("> ")
        return await self._unless_quit(self.lines.get())

    async def _unless_quit(self, awaitable: Awaitable[T]) -> T | None:
        """``awaitable``'s result, or None when the user quits first."""
        task = asyncio.ensure_future(awaitable)
        quit = asyncio.ensure_future(self.quit.wait())
        await asyncio.wait({task, quit}, return_when=asyncio.FIRST_COMPLETED)
        quit.cancel()
        if task.done():
            return task.result()
        task.cancel()
        return None

    async def _handle(self, text: str) -> int | None:
        if not text:
            return None
        if text.startswith("/") and not text.startswith("//"):
            name, _, rest = text.partition(" ")
            command = self.commands.get(name)
            if command is None:
                self._notice(f"unknown command {name}; /help lists them")
                return None
            return await command(rest.strip())
        return await self._ask(text.removeprefix("/") if text.startswith("//") else text)

    async def _ask(self, text: str) -> int | None:
        self.reply, self.stopping = self.chat.prompt(text), False
        finished = await self._unless_quit(self._stream(self.reply))
        if finished is None:  # a second Ctrl-C: leave without waiting for the stop
            self.reply = None
            self._write("\n")
            return ExitStatus.OK
        return None

    async def _stream(self, reply: Reply) -> bool:
        wrote = False
        try:
            async for piece in reply:
                self._write(piece)
                wrote = True
        except ChatError as error:
            self.reply = None
            self._write("\n" if wrote else "")
            self._notice(error_line(error))
            return True
        self.reply = None  # from here on Ctrl-C means "quit", before the prompt shows
        assert reply.done is not None
        if reply.done.reason is FinishReason.CANCELLED:
            self._write(("\n" if wrote else "") + "[stopped]\n")
            return True
        self._write("\n")
        if reply.done.reason is FinishReason.LENGTH:
            self._notice(length_notice(reply.done, self.chat.limits))
        return True

    async def _reset(self, rest: str) -> None:
        await self.chat.reset()
        self._write("[reset]\n")

    async def _system(self, rest: str) -> None:
        await self.chat.configure(system=rest)
        self._write("[system prompt set]\n" if rest else "[system prompt cleared]\n")

    async def _image(self, rest: str) -> None:
        if not rest:
            self._notice("usage: /image PATH")
            return
        path = Path(rest).expanduser()
        try:
            data = path.read_bytes()
        except OSError as e:
            self._notice(f"error: usage: cannot read image {path}: {e.strerror}")
            return
        ok = await self.chat.image(data)
        self._write(f"[image attached to the next message: {path.name}, {ok.width}x{ok.height}]\n")

    async def _help(self, rest: str) -> None:
        self._write(HELP + "\n")

    async def _leave(self, rest: str) -> int:
        return ExitStatus.OK

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _notice(self, text: str) -> None:
        print(text, file=self.err, flush=True)


async def chat_session(
    url: str,
    *,
    token: str | None = None,
    timeout: float | None = 60.0,
    system: str | None = None,
    params: dict[str, Any] | None = None,
    load_wait: float = 0.0,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    def on_goaway(frame: GoAway) -> None:
        print(f"[the server is shutting down in {frame.in_ms} ms]", file=err, flush=True)

    loop = asyncio.get_running_loop()
    opening = connect(
        url,
        token=token,
        timeout=timeout,
        on_goaway=on_goaway,
        load_wait=load_wait,
        on_waiting=waiting_notice(load_wait, err),
    )
    try:
        async with opening as chat:
            print(
                f"connected to {chat.model} at {url}; /help lists the commands",
                file=err,
                flush=True,
            )
            if system is not None or params:
                await chat.configure(system=system, **(params or {}))
            repl = Repl(chat, StdinLines(loop).queue, out, err)
            loop.add_signal_handler(signal.SIGINT, repl.on_sigint)
            try:
                return await repl.run()
            finally:
                loop.remove_signal_handler(signal.SIGINT)
    except (ClientError, TimeoutError) as error:
        print(error_line(error), file=err, flush=True)
        return exit_status(error)
