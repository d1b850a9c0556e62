"""``Relay``: a session's frames on their way to its connection, and what a resume needs of them.

Every frame a session sends goes through its relay to the connection's outbox. The reply of the
last prompt is recorded as it goes (its ``token`` frames by its run, in the ``ReplyRecord`` the
relay reads; its ``error`` and ``done`` here), so that a client whose connection dropped
mid-reply and that resumes (PROTOCOL.md section 10) gets what it missed: one ``token`` frame
with all the text after the index it names, then the rest, none of it twice. While no
connection is attached (a drop mid-reply, for ``--resume-grace-s``) the reply's ``queued`` and
``start`` frames are held for the next one.

What is kept is bounded by one reply (its text and ids, and five integers per frame: a slow
reader gets many frames; with logprobs, each frame's), the next prompt's ``begin`` lets it go.
A replay costs its frame, and one is in flight per session at most: a resume drops the
connection it replaces (``drop_last``), which may still be flushing the last replay to a peer
that never read it.

A store outside this process (redis_store.py) keeps a reply that ended with no connection
attached with the session's state (``export``, ``restore``), so a resume that rebuilds the
session from the store gets the same catch-up as one that finds it in memory.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from wschat.protocol import (
    Done,
    Error,
    Frame,
    ProtocolError,
    Queued,
    Start,
    Token,
    TokenLogprobs,
    ToolCall,
    decode_server_frame,
    encode,
)

from ..engine import TextPieces
from .error_boundary import Send


@dataclass(frozen=True, slots=True)
class CatchUp:
    """What a resuming connection sends after ``ready`` and before any live frame: the frames of
    ``reply`` (None: no reply is resumed) the client did not get."""

    reply: str | None = None
    frames: list[Frame] = field(default_factory=list)


class ReplyRecord:
    """One reply as its run sent it, packed, kept once for all who need it: the text of its
    ``token`` frames, every id generated (those that came without text too: a checkpoint's, for
    a resume elsewhere), and where each frame ends, for the relay's catch-up; and its
    ``tool_call`` frames, which a catch-up sends again whole (few, and keyed by their call id)."""

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []
        self.text = TextPieces()
        self.ids = array("q")
        self._indexes = array("q")  # each frame's index
        self._text_ends = array("q")  # where each frame's text ends in the whole text
        self._id_starts = array("q")  # each frame's ids, in ``ids``
        self._id_ends = array("q")
        self._shows_ids = False  # the frames carry their ids
        # each frame's logprobs, from the first frame that carried some (None for those before)
        self._logprobs: list[TokenLogprobs | None] = []

    def add(self, ids: Sequence[int], frame: Token | None) -> None:
        """Ids generated, and the frame that carries them (None: they came without text)."""
        start = len(self.ids)
        self.ids.extend(ids)
        if frame is None:
            return
        self.text.append(frame.text)
        self._shows_ids = frame.ids is not None
        self._indexes.append(frame.index)
        self._text_ends.append((self._text_ends[-1] if self._text_ends else 0) + len(frame.text))
        self._id_starts.append(start)
        self._id_ends.append(len(self.ids))
        if frame.logprobs is not None and not self._logprobs:
            self._logprobs = [None] * (len(self._indexes) - 1)
        if self._logprobs:
            self._logprobs.append(frame.logprobs)

    def settle(self) -> None:
        """The reply is over: its ids served a checkpoint of the running reply, and a resume's
        catch-up reads them only when its frames carried them; so kept only then, and an idle
        session holds its last reply's text alone."""
        if not self._shows_ids:
            self.ids, self._id_starts, self._id_ends = array("q"), array("q"), array("q")

    def after(self, reply: str, last: int) -> Token | None:
        """One frame with every frame's text (and ids) after index ``last``; None when there
        is none."""
        first = bisect_right(self._indexes, last)
        if first == len(self._indexes):
            return None
        text_from = self._text_ends[first - 1] if first else 0
        ids = None
        if self._shows_ids:
            spans = zip(self._id_starts[first:], self._id_ends[first:], strict=True)
            ids = tuple(i for start, end in spans for i in self.ids[start:end])
        parts = [part for part in self._logprobs[first:] if part is not None]
        logprobs = TokenLogprobs.joined(parts) if parts else None
        # the kept text itself from index 0 (a slice of all of a str is that str), else its tail
        return Token(reply, self.text.join()[text_from:], self._indexes[-1], ids, logprobs)

    def export(self) -> dict[str, Any]:
        """The frames as plain data: the text, and each frame's index, where its text ends and
        its ids (None: the frames carried none), and its logprobs' wire map where it had any."""
        frames: list[list[Any]] = []
        for k, (index, text_end) in enumerate(zip(self._indexes, self._text_ends, strict=True)):
            ids = list(self.ids[self._id_starts[k] : self._id_ends[k]]) if self._shows_ids else None
            frames.append([index, text_end, ids])
            if self._logprobs and (logprobs := self._logprobs[k]) is not None:
                frames[-1].append(logprobs.to_wire())
        calls = [encode(call) for call in self.calls]
        return {"text": self.text.join(), "frames": frames, "calls": calls}

    @classmethod
    def restore(cls, reply: str, kept: dict[str, Any]) -> ReplyRecord:
        """``export``'s data, as the frames that made it; ``ValueError`` when it is not that."""
        record, text, at = cls(), kept["text"], 0
        if not isinstance(text, str):
            raise ValueError("a reply's text is not a str")
        for index, text_end, ids, *more in kept["frames"]:
            if more and not isinstance(more[0], dict):
                raise ValueError("a reply's frame logprobs are not a map")
            logprobs = TokenLogprobs.from_wire(more[0]) if more else None
            last = record._indexes[-1] if record._indexes else 0
            if not (isinstance(index, int) and isinstance(text_end, int)) or index <= last:
                raise ValueError("a reply's frame indexes are not rising integers")
            if not at <= text_end <= len(text):
                raise ValueError("a reply's frame ends outside its text")
            shown = None if ids is None else tuple(ids)
            record.add(shown or (), Token(reply, text[at:text_end], index, shown, logprobs))
            at = text_end
        if at != len(text):
            raise ValueError("a reply's frames do not cover its text")
        for data in kept.get("calls", ()):
            call = decode_server_frame(data)
            if not isinstance(call, ToolCall) or call.id != reply:
                raise ValueError("a reply's calls are not its tool_call frames")
            record.calls.append(call)
        return record


@dataclass(frozen=True, slots=True)
class KeptReply:
    """A reply that ended while no connection was attached, as ``Relay.export`` kept it."""

    reply: str
    in_flight: bool
    ending: tuple[Frame, ...]  # its error and done
    record: ReplyRecord

    @classmethod
    def read(cls, kept: dict[str, Any]) -> KeptReply:
        """``Relay.export``'s data; ``ValueError`` when it is not that."""
        try:
            reply, in_flight = kept["reply"], kept["in_flight"]
            if not isinstance(reply, str) or not isinstance(in_flight, bool):
                raise ValueError("a kept reply without its id")
            ending = tuple(decode_server_frame(data) for data in kept["ending"])
            if not all(isinstance(f, Error | Done) and f.id == reply for f in ending):
                raise ValueError("a kept reply's ending is not its error and done")
            record = ReplyRecord.restore(reply, kept["record"])
        except (KeyError, TypeError, OverflowError, ProtocolError) as e:
            raise ValueError(f"not a kept reply: {e!r}") from e
        return cls(reply, in_flight, ending, record)


class Relay:
    def __init__(self, target: Send | None = None) -> None:
        self._target = target  # the connection's outbox; None while detached
        self.reply: str | None = None  # the id of the last prompt's reply
        self._record = ReplyRecord()  # its token frames, as its run recorded them
        self._ending: list[Frame] = []  # its error and done frames
        # frames sent while no connection is attached mid-reply, for the next one (attach)
        self._held: list[Frame] = []
        # the connection went while the reply ran or waited: the next one gets its frames
        # without asking (set by detach, cleared once a connection is attached again)
        self.in_flight = False
        # drops the connection last attached at once, with what it has not sent (a no-op once
        # it is gone); that connection's (``connected``)
        self.drop_last: Callable[[], None] | None = None

    async def __call__(self, frame: Frame) -> None:
        if isinstance(frame, Error | Done) and frame.id == self.reply:
            self._ending.append(frame)
        target = self._target
        if target is None:
            if self.in_flight:  # else there is nobody to hold it for
                self._held.append(frame)
            return
        await target(frame)

    def connected(self, drop: Callable[[], None] | None) -> None:
        """A connection holds the session now: ``drop`` drops it (the next one's catch-up does)."""
        self.drop_last = drop

    def begin(self, reply: str, record: ReplyRecord) -> None:
        """A prompt was accepted: its reply is the one a resume gets, ``record`` its tokens."""
        self.reply, self._ending, self.in_flight = reply, [], False
        self._record = record

    def detach(self, mid_reply: bool) -> None:
        """The connection is gone; ``mid_reply``: a drop while the reply ran or waited (it goes
        on, or was cancelled for want of anything to resume): the next one gets its frames."""
        self._target = None
        self._held = []
        self.in_flight = mid_reply

    def catch_up(self, last: int | None) -> CatchUp:
        """What a resuming client missed of the reply: none when no reply was in flight and the
        client names no ``last`` (the index of the last ``token`` frame it got; absent: none).
        The frames held since the drop that open the reply (``queued``, ``start``), one
        ``token`` frame with the text of every frame after index ``last`` (a ``last`` between
        boundaries counts as the boundary below, one past the end as the end), every
        ``tool_call`` frame of the reply, then the reply's ``error`` and ``done`` if it ended.
        Frames sent from now on are held for ``attach``. The connection before is dropped
        first: what it was still sending is nobody's now."""
        if self.drop_last is not None:
            self.drop_last()
        if self.reply is None or not (self.in_flight or last is not None):
            return CatchUp()
        opening = [f for f in self._held if isinstance(f, Queued | Start)]
        self._held = []
        after = self._record.after(self.reply, last or 0)
        replay: list[Frame] = [after] if after else []
        calls = self._record.calls
        return CatchUp(self.reply, [*opening, *replay, *calls, *self._ending])

    def export(self) -> dict[str, Any] | None:
        """What a resume needs of a reply that ended while no connection was attached (its
        frames, its error and done, whether it was in flight at the drop), as plain data; None
        while a connection is attached or no reply has ended."""
        if self._target is not None or self.reply is None:
            return None
        if not any(isinstance(frame, Done) for frame in self._ending):
            return None
        return {
            "reply": self.reply,
            "in_flight": self.in_flight,
            "ending": [encode(frame) for frame in self._ending],
            "record": self._record.export(),
        }

    def restore(self, kept: dict[str, Any]) -> None:
        """``export``'s data, in a relay no connection was attached to; ``ValueError`` when it is
        not that (nothing is changed then)."""
        self.keep(KeptReply.read(kept))

    def keep(self, kept: KeptReply) -> None:
        """A reply read back from a store (``KeptReply.read``), for the next resume."""
        self.reply, self.in_flight = kept.reply, kept.in_flight
        self._ending, self._record = list(kept.ending), kept.record

    async def attach(self, send: Send) -> None:
        """Send what was held since the catch-up, in order, then pass frames on as they come."""
        while self._held:
            await send(self._held.pop(0))
        self._target = send  # no await since the list was seen empty: nothing slips between
        self.in_flight = False
