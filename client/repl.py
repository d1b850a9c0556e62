"""``wschat chat``: the interactive loop.

Each reply streams to stdout piece by piece. Ctrl-C while a reply streams sends ``cancel`` and
prints ``[stopped]`` once its ``done`` arrives; a second Ctrl-C before then, Ctrl-C at the prompt
and end of input leave with status 0. A reply cut at the length limit is followed by a notice
and the chat goes on. A server that goes away (``goaway``, close 1001) is left for another
replica once the reply running there has ended, and the conversation goes on there
(``RESUMED_NOTICE``). Notices and errors go to stderr.
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

from wschat.protocol import FinishReason, GoAway, Ready

from .api import Chat
from .errors import ChatError, ClientError, ConnectionClosedError
from .opening import connect
from .reply import Reply
from .status import (
    RESUMED_NOTICE,
    STOPPING_NOTICE,
    ExitStatus,
    error_line,
    exit_status,
    length_notice,
)
from .waiting import DEFAULT_EVERY_S, WaitingNotices

T = TypeVar("T")

HELP = """\
commands:
  /retry [TEMP]   a new reply to your last message in place of the last reply
                  (TEMP: its temperature, 0 to 2; at 0, greedy, it comes out the same)
  /edit TEXT      replace your last message with TEXT; a new reply follows
  /edit N TEXT    replace your message N with TEXT; the messages after it go
                  (an edit sends text alone: /image again first to keep an image)
  /back [N]       drop your last N messages (default 1) and their replies
  /history        your messages in this conversation, by number
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
        # the user's message of each exchange the conversation holds (None: not sent from here)
        self.messages: list[str | None] = []
        self.commands: dict[str, Command] = {
            "/retry": self._retry,
            "/edit": self._edit,
            "/back": self._back,
            "/history": self._history,
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
        return await self._follow(self.chat.prompt(text), text)

    async def _follow(self, reply: Reply, text: str | None = None) -> int | None:
        """Stream ``reply`` (to the user's message ``text``, None: the same message again)."""
        self.reply, self.stopping = reply, False
        finished = await self._unless_quit(self._stream(reply))
        if finished is None:  # a second Ctrl-C: leave without waiting for the stop
            self.reply = None
            self._write("\n")
            return ExitStatus.OK
        if reply.turn is not None and text is not None:
            self._sync()
            self.messages[reply.turn - 1] = text
        return None

    def _sync(self) -> None:
        """``messages`` as long as the conversation (the server's count decides)."""
        held = self.chat.turns
        if held is not None:
            del self.messages[held:]
            self.messages += [None] * (held - len(self.messages))

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

    async def _retry(self, rest: str) -> int | None:
        params: dict[str, Any] = {}
        if rest:
            try:
                params["temperature"] = float(rest)
            except ValueError:
                self._notice("usage: /retry [TEMP]")
                return None
        turn = self.chat.turns
        reply = self.chat.regenerate(**params)  # an empty conversation: refused by the server
        if turn:
            self._write(f"[a new reply to message {turn}]\n")
        status = await self._follow(reply)
        if turn and reply.turn is None and status is None:  # refused, failed or never started
            self._write(f"[the earlier reply to message {turn} stays]\n")
        return status

    async def _edit(self, rest: str) -> int | None:
        number, _, text = rest.partition(" ")
        turn: int | None
        if number.isdecimal() and text.strip():
            turn, text = int(number), text.strip()
        else:
            turn, text = self.chat.turns, rest
        if not text:
            self._notice("usage: /edit TEXT or /edit N TEXT")
            return None
        if turn is None:
            self._notice("error: usage: the messages are not numbered here: /edit N TEXT")
            return None
        held = self.chat.turns
        reply = await self.chat.edit(turn, text)  # no such message: refused, nothing changes
        later = "" if held is None or held <= turn else f"; {_span(turn + 1, held)} dropped"
        self._write(f"[message {turn} replaced{later}]\n")
        status = await self._follow(reply, text)
        if not reply.accepted:  # refused: the rewind stays
            self._write(f"[message {turn} dropped, not replaced]\n")
        self._sync()
        return status

    async def _back(self, rest: str) -> None:
        if rest and not rest.isdecimal():
            self._notice("usage: /back [N]")
            return
        count, held = int(rest or 1), self.chat.turns
        if held is None:
            self._notice("error: usage: the messages are not numbered here: /reset starts afresh")
            return
        if count > held:
            self._notice(f"error: usage: /back {count}: the conversation holds {held}")
            return
        kept = await self.chat.rewind(held - count)
        self._sync()
        went = _span(kept + 1, held)
        self._write(f"[{went} dropped; {kept} left]\n" if count else "[nothing dropped]\n")

    async def _history(self, rest: str) -> None:
        self._sync()
        if not self.messages:
            self._write("[no messages yet]\n")
        for number, text in enumerate(self.messages, 1):
            shown = "(sent before this client)" if text is None else _one_line(text)
            self._write(f"{number:>3}  {shown}\n")

    async def _reset(self, rest: str) -> None:
        await self.chat.reset()
        self.messages.clear()
        self._write("[reset]\n")

    async def _system(self, rest: str) -> None:
        await self.chat.configure(system=rest)
        self.messages.clear()
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


def _span(first: int, last: int) -> str:
    """Messages ``first`` to ``last`` and their replies, in words."""
    if first == last:
        return f"message {first} and its reply"
    return f"messages {first}-{last} and their replies"


def _one_line(text: str, width: int = 72) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."


async def chat_session(
    url: str,
    *,
    token: str | None = None,
    timeout: float | None = 60.0,
    system: str | None = None,
    params: dict[str, Any] | None = None,
    load_wait: float = 0.0,
    wait_notice_s: float = DEFAULT_EVERY_S,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    def on_goaway(frame: GoAway) -> None:
        print(f"[the server is shutting down in {frame.in_ms} ms]", file=err, flush=True)

    def on_resume(ready: Ready) -> None:
        print(RESUMED_NOTICE, file=err, flush=True)

    loop = asyncio.get_running_loop()
    waiting = WaitingNotices(url, load_wait, err, wait_notice_s)
    opening = connect(
        url,
        token=token,
        timeout=timeout,
        on_goaway=on_goaway,
        on_resume=on_resume,
        load_wait=load_wait,
        on_waiting=waiting.notice,
    )
    try:
        async with opening as chat:
            waiting.stop(answered=True)
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
    finally:
        waiting.stop()
