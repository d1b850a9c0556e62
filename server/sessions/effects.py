"""What a session's core (core.py) asks for, as plain data: ``Session`` (session.py) performs
each, in order, and feeds what it yields back to the core as an input (inputs.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from wschat.protocol import Configure, Frame, Image, ToolResult

from ..engine import PreparedTurn, SamplingParams, ToolUse

if TYPE_CHECKING:
    from .images import CheckedImage
    from .inputs import Converse, Input
    from .slots import Ticket


@dataclass(frozen=True, slots=True)
class SendFrame:
    """To the session's connection (its relay: kept for a resume while none is attached)."""

    frame: Frame


@dataclass(frozen=True, slots=True)
class SetSystem:
    """The ``configure`` frame's system prompt, tokenized and set in the chat, or its refusal
    raised; yields ``SystemSet``."""

    frame: Configure


@dataclass(frozen=True, slots=True)
class CheckImage:
    """The ``image`` frame's upload checked for staging (turns.py), or its refusal raised;
    yields ``ImageChecked``."""

    frame: Image


@dataclass(frozen=True, slots=True)
class LoadConversation:
    """The conversation before the turn to answer, tokenized, checked and set in the chat
    (turns.py), or its refusal raised; yields ``ConversationLoaded``."""

    conversation: Converse


@dataclass(frozen=True, slots=True)
class PromptTurn:
    """A user's turn: its text, the uploads it carries and the images staged before it."""

    text: str
    uploads: tuple[bytes, ...]
    staged: tuple[CheckedImage, ...]
    sampling: SamplingParams
    tools: ToolUse | None = None


@dataclass(frozen=True, slots=True)
class RegenerateTurn:
    """The last exchange's user turn again, its tool rounds dropped."""

    sampling: SamplingParams
    tools: ToolUse | None = None


@dataclass(frozen=True, slots=True)
class ResultsTurn:
    """The results of the calls the last reply made: the exchange goes on."""

    results: tuple[ToolResult, ...]
    sampling: SamplingParams
    tools: ToolUse | None = None


@dataclass(frozen=True, slots=True)
class CompletionTurn:
    """A raw prompt: its text, tokenized as text, or its token ids."""

    text: str | None
    ids: tuple[int, ...] | None
    sampling: SamplingParams


# A kind of turn to prepare; each has its case in turns.py
TurnKind = PromptTurn | RegenerateTurn | ResultsTurn | CompletionTurn


@dataclass(frozen=True, slots=True)
class PrepareTurn:
    """The turn of the prompt ``id`` counted and checked against the context (its uploads
    checked first), or its refusal raised; yields ``TurnPrepared``."""

    id: str
    turn: TurnKind
    token_ids: bool  # its token frames carry their ids


@dataclass(frozen=True, slots=True)
class StartRun:
    """The accepted prompt's run (generation.py), from the queue to its ``done``; it feeds the
    core ``RunBegan``, ``RunGrew`` and, last, ``RunEnded``."""

    id: str
    prepared: PreparedTurn
    ticket: Ticket
    token_ids: bool
    scope: str  # whose cached state it may share (engine/history.py ``Chat.start``)


@dataclass(frozen=True, slots=True)
class CancelRun:
    """Cancel the run (its ``done`` comes as it ends)."""


@dataclass(frozen=True, slots=True)
class StopRun:
    """Cancel the run and wait for its end (its ``done`` sent), then feed ``then``."""

    then: Input | None


@dataclass(frozen=True, slots=True)
class SetGrace:
    """Feed ``GraceOver`` in ``seconds``, and hold the connection's place till then."""

    seconds: float


@dataclass(frozen=True, slots=True)
class EndGrace:
    """Cancel the grace timer, if one is set, and let the connection's place go."""


@dataclass(frozen=True, slots=True)
class Detach:
    """The connection is gone; ``in_flight``: a reply ran or waited, and the next connection
    is sent its frames without asking (relay.py)."""

    in_flight: bool


@dataclass(frozen=True, slots=True)
class Save:
    """A turn boundary: the store keeps the session's state."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The running reply grew: the store keeps its tokens so far."""


@dataclass(frozen=True, slots=True)
class CountRewind:
    """A ``rewind`` answered (False) or a ``regenerate`` accepted (True), for the stats."""

    regenerate: bool


Effect = (
    SendFrame
    | SetSystem
    | CheckImage
    | LoadConversation
    | PrepareTurn
    | StartRun
    | CancelRun
    | StopRun
    | SetGrace
    | EndGrace
    | Detach
    | Save
    | Checkpoint
    | CountRewind
)

# the effects that carry no data, once
SAVE, END_GRACE, CANCEL_RUN, CHECKPOINT = Save(), EndGrace(), CancelRun(), Checkpoint()


@dataclass(slots=True)
class AcceptedRun:
    """What the core keeps of the prompt (or regenerate) it accepted, until its run ends."""

    id: str
    prepared: PreparedTurn
    grew: bool = False  # a token frame went out: there is something to resume
