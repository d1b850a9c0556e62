"""What a session's core (core.py) is fed, besides the client's frames, which it takes as they
come (``ClientFrame``): an API request's whole prompt, the result of an effect it asked for
(effects.py), what its run did, and what became of its connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from wschat.protocol import ClientFrame, GenerationParams, ToolResult

from ..engine import FunctionCall

if TYPE_CHECKING:
    from ..engine import PreparedTurn
    from .effects import CheckImage, LoadConversation, PrepareTurn, SetSystem
    from .images import CheckedImage

# -- an API request's whole prompt (web/openai_api), held to a prompt frame's rules ------------


@dataclass(frozen=True, slots=True)
class UserSaid:
    """A user's message: its text and images (each upload's bytes)."""

    text: str
    images: tuple[bytes, ...] = ()

    @property
    def texts(self) -> tuple[str, ...]:
        return (self.text,)


@dataclass(frozen=True, slots=True)
class ReplySaid:
    """A reply given earlier, sent back as its text and the calls it made (their ids the ones
    the door gave them), with the ids it was generated as where the door remembers them (then
    it renders exactly as in a session that kept it)."""

    text: str
    ids: tuple[int, ...] | None = None
    calls: tuple[FunctionCall, ...] = ()

    @property
    def texts(self) -> tuple[str, ...]:
        return (self.text, *(call.arguments for call in self.calls))


@dataclass(frozen=True, slots=True)
class ResultsSaid:
    """The results of the calls the reply before it made (a tool message each)."""

    results: tuple[ToolResult, ...]

    @property
    def texts(self) -> tuple[str, ...]:
        return tuple(result.content for result in self.results)


# A message of a conversation sent whole. Each kind has its ``texts`` (each held to a prompt's
# size) and its case where a conversation is loaded (turns.py).
Said = UserSaid | ReplySaid | ResultsSaid


@dataclass(frozen=True, slots=True)
class Converse:
    """A conversation sent whole (a chat completion): the system text, the messages before the
    turn to answer (a user's first, then its replies: one that called tools is followed by
    their results, the last one did not; then the next user's), and that turn: a user's, or the
    results of the calls the last reply made."""

    id: str
    system: str | None
    history: tuple[Said, ...]
    user: UserSaid | ResultsSaid
    params: GenerationParams | None = None


@dataclass(frozen=True, slots=True)
class Complete:
    """A raw prompt (a completion): its text, tokenized as text, or its token ids; no prompt
    format around it."""

    id: str
    text: str | None
    ids: tuple[int, ...] | None = None
    params: GenerationParams | None = None


# -- what an effect yielded ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SystemSet:
    request: SetSystem


@dataclass(frozen=True, slots=True)
class ImageChecked:
    request: CheckImage
    image: CheckedImage


@dataclass(frozen=True, slots=True)
class ConversationLoaded:
    request: LoadConversation


@dataclass(frozen=True, slots=True)
class TurnPrepared:
    request: PrepareTurn
    prepared: PreparedTurn


# -- its run (generation.py) ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunBegan:
    """A slot was granted: the reply starts."""


@dataclass(frozen=True, slots=True)
class RunGrew:
    """A ``token`` frame went out."""


@dataclass(frozen=True, slots=True)
class RunEnded:
    kept: bool  # the conversation holds its exchange: it started and did not fail


# -- its connection ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dropped:
    """The connection is gone; ``grace_s``: how long a reply in flight may go on without one
    (0: a clean close, or no resume window).

    A drop is a connection that ended mid-reply without a close frame (PROTOCOL.md section 10):
    the reply goes on without it for ``--resume-grace-s``, its frames kept by the ``Relay``
    (relay.py) for the connection that resumes the session; a clean close, ``cancel``,
    ``reset`` and shutdown cancel it at once, as a drop does before the reply's first token (a
    queued prompt included): nothing of it to resume. No frame reaches a detached session: no
    connection feeds it."""

    grace_s: float


@dataclass(frozen=True, slots=True)
class TakenOver:
    """A connection took the session over (a resume): whose fair share and whose cached state
    it uses from now on."""

    address: str
    scope: str


@dataclass(frozen=True, slots=True)
class GraceOver:
    """Nobody resumed the session within the grace a drop left its reply."""


@dataclass(frozen=True, slots=True)
class Close:
    """For good (no resume window, the window over, shutdown)."""


Input = (
    ClientFrame
    | Converse
    | Complete
    | SystemSet
    | ImageChecked
    | ConversationLoaded
    | TurnPrepared
    | RunBegan
    | RunGrew
    | RunEnded
    | Dropped
    | TakenOver
    | GraceOver
    | Close
)
# every input that is no client frame (protocol/frames.py ``CLIENT_FRAMES`` lists those)
INPUTS: tuple[type[Input], ...] = (
    Converse,
    Complete,
    SystemSet,
    ImageChecked,
    ConversationLoaded,
    TurnPrepared,
    RunBegan,
    RunGrew,
    RunEnded,
    Dropped,
    TakenOver,
    GraceOver,
    Close,
)
