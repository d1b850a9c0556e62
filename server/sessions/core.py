"""``SessionCore``: one session's rules, with no I/O: fed an input, it answers with effects.

As python-websockets' sans-I/O ``Protocol`` and h11's ``ConnectionState``, it keeps the state and
decides, and awaits nothing, starts no task, sets no timer. Its inputs (inputs.py: the client's
frames, an API request's whole prompt, what an effect yielded, what its run did, what became of
its connection) come from ``Session`` (session.py), which performs its effects (effects.py, plain
data). Its collaborators (the ``Chat``, the slots, the limits) come at construction (hub.py).

The rules are two tables, read top to bottom: ``TRANSITIONS`` (states.py: what moves the state) and,
at the end of this module, ``SessionCore.RULES`` (which handler each input gets in each state: the
core's own, or, for a request for a turn, one of turn_requests.py, which reads and changes nothing).
Whether the session is busy is its state and nothing else. A refusal (``busy`` in a state that
refuses the frame) raises a typed ``ProtocolError`` and changes nothing; the door makes it an
``error`` frame (or the API's error). An input a state does not expect, or a change ``TRANSITIONS``
does not list, is our bug (``SessionMisuse``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from wschat.protocol import (
    Busy,
    Cancel,
    Configure,
    Configured,
    GenerationParams,
    Image,
    ImageOk,
    InvalidParams,
    NotRunning,
    Ping,
    Pong,
    Prompt,
    Regenerate,
    Reset,
    ResetOk,
    Rewind,
    Rewound,
    SessionMisuse,
    ToolResults,
)
from wschat.protocol.frames import CLIENT_FRAMES

from ..engine import Chat, PreparedTurn
from . import turn_requests
from .effects import (
    CANCEL_RUN,
    CHECKPOINT,
    END_GRACE,
    SAVE,
    AcceptedRun,
    CheckImage,
    CountRewind,
    Detach,
    Effect,
    PromptTurn,
    RegenerateTurn,
    SendFrame,
    SetGrace,
    SetSystem,
    StartRun,
    StopRun,
)
from .inputs import (
    INPUTS,
    Close,
    Complete,
    ConversationLoaded,
    Converse,
    Dropped,
    GraceOver,
    ImageChecked,
    Input,
    RunBegan,
    RunEnded,
    RunGrew,
    SystemSet,
    TakenOver,
    TurnPrepared,
)
from .limits import PromptLimits
from .slots import GenerationSlots
from .states import (
    BUSY_STATES,
    CLOSED,
    DETACHED_STATES,
    IDLE,
    QUEUED,
    RUNNING,
    RUNNING_DETACHED,
    TRANSITIONS,
    Change,
    SessionState,
)

if TYPE_CHECKING:
    from .images import CheckedImage
    from .snapshot import Restored

log = logging.getLogger("wschat.session")

Effects = list[Effect]
Handler = Callable[["SessionCore", Any], Effects]
Rules = dict[type[Input], Handler]


class SessionCore:
    def __init__(
        self,
        key: str,
        chat: Chat,
        slots: GenerationSlots,
        limits: PromptLimits,
        *,
        address: str = "unknown",
        scope: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.key = key
        self.chat = chat  # the conversation, as token ids per turn
        self.slots = slots
        self.limits = limits
        self.address = address  # its connection's client address: whose fair share it uses
        # whose cached state its runs may share (web/access.py ``owner_scope``)
        self.scope = scope
        self.clock = clock
        self.state = IDLE
        self.defaults = GenerationParams()
        self.staged: list[CheckedImage] = []  # images sent for the next prompt
        self.used_ids: set[str] = set()  # every generation id this session has had
        # the id of the prompt (or regenerate) of each exchange the conversation holds, in
        # order; None where it is unknown (a state stored before they were kept)
        self.turn_ids: list[str | None] = []
        self.accepted: AcceptedRun | None = None
        self.last_active_at = clock()  # when its last generation ended

    RULES: ClassVar[dict[SessionState, Rules]]

    def receive(self, event: Input) -> Effects:
        """What ``event`` asks for in the current state, as the table says."""
        return self.RULES[self.state][type(event)](self, event)

    @property
    def busy(self) -> bool:
        """A generation runs or waits for a slot."""
        return self.state in BUSY_STATES

    @property
    def last_prompt(self) -> str | None:
        """The id of the prompt (or regenerate) of the conversation's last exchange."""
        return self.turn_ids[-1] if self.turn_ids else None

    def held_images(self) -> list[Any]:
        """Its conversation's images, a queued prompt's (a regenerate's are the last exchange's
        own), the staged ones."""
        held, accepted = self.chat.images, self.accepted
        if accepted is not None and self.state is QUEUED and not accepted.prepared.replaces:
            held = [*held, *accepted.prepared.turn.images]
        return [*held, *(c.image for c in self.staged)]

    def restore(self, saved: Restored) -> None:
        """What ``snapshot.import_state`` read back, its conversation in the chat already."""
        self.defaults, self.staged, self.used_ids = saved.defaults, saved.staged, saved.used_ids
        self.turn_ids = saved.turn_ids

    def _change(self, change: Change) -> None:
        new = TRANSITIONS[self.state].get(change)
        if new is None:
            raise SessionMisuse(f"session {self.state.value}: {change.value} is not allowed")
        if new is not self.state:
            log.debug("session %s: %s -> %s", self.key, self.state.value, new.value)
        self.state = new

    # -- what a connection sends ---------------------------------------------------------------

    def _on_ping(self, frame: Ping) -> Effects:
        return [SendFrame(Pong(frame.t))]

    def _refuse_busy(
        self, frame: Prompt | Regenerate | ToolResults | Configure | Rewind
    ) -> Effects:
        frame_id = getattr(frame, "id", None)  # a prompt's, a regenerate's, an API request's
        raise Busy("a generation is already running in this session", id=frame_id)

    def _drop(self, event: Input) -> Effects:
        """A closed or detached session answers nothing: no connection feeds it."""
        log.debug("session %s: %s when %s, dropped", self.key, type(event).__name__, self.state)
        return []

    def _misuse(self, event: Input) -> Effects:
        raise SessionMisuse(f"session {self.state.value}: {type(event).__name__} is not expected")

    def _on_configure(self, frame: Configure) -> Effects:
        if frame.params is not None:
            self.limits.check_params(frame.params)
        if frame.system is not None:
            # PROTOCOL.md "configure": checked (too large) before anything changes
            return [SetSystem(frame)]
        return self._configured(frame)

    def _on_system_set(self, done: SystemSet) -> Effects:
        self.turn_ids.clear()  # the conversation starts afresh
        return self._configured(done.request.frame)

    def _configured(self, frame: Configure) -> Effects:
        if frame.params is not None:
            self.defaults = frame.params.merged_over(self.defaults)
        return [SendFrame(Configured()), SAVE]

    def _cancel_run(self, frame: Cancel) -> Effects:
        assert self.accepted is not None  # QUEUED and RUNNING have one
        if frame.id in (None, self.accepted.id):
            log.debug("session %s: %s cancelled", self.key, self.accepted.id)
            return [CANCEL_RUN]
        return self._cancel_finished(frame)

    def _cancel_finished(self, frame: Cancel) -> Effects:
        if frame.id is not None and frame.id not in self.used_ids:
            raise NotRunning(f"no generation {frame.id!r} in this session", id=frame.id)
        return []  # PROTOCOL.md "cancel": silent for one that has already finished

    def _on_reset(self, frame: Reset) -> Effects:
        if self.accepted is not None:
            return [StopRun(frame)]  # its done goes first; the reset once it ended
        self.chat.reset()
        self.turn_ids.clear()
        self.staged.clear()
        return [SendFrame(ResetOk()), SAVE]

    def _on_image(self, frame: Image) -> Effects:
        return [CheckImage(frame)]

    def _on_image_checked(self, done: ImageChecked) -> Effects:
        image = done.image
        self.staged.append(image)
        return [SendFrame(ImageOk(done.request.frame.id, image.width, image.height)), SAVE]

    def _on_rewind(self, frame: Rewind) -> Effects:
        held = self.chat.turns
        if frame.keep > held:
            raise InvalidParams(f"keep is {frame.keep}; the conversation holds {held} exchanges")
        self.chat.rewind(frame.keep)
        del self.turn_ids[frame.keep :]
        return [CountRewind(False), SendFrame(Rewound(self.chat.turns)), SAVE]

    def _on_turn_prepared(self, done: TurnPrepared) -> Effects:
        request = done.request
        effects = self._launch(request.id, done.prepared, request.token_ids)
        if isinstance(request.turn, PromptTurn):
            self.staged.clear()  # the prompt took them
        if isinstance(request.turn, RegenerateTurn):
            effects.append(CountRewind(True))
        return effects

    def _launch(self, run_id: str, prepared: PreparedTurn, token_ids: bool) -> Effects:
        """Queue the run (``overloaded`` when the queue is full), its id used from now on."""
        ticket = self.slots.enqueue(self.address)
        self.used_ids.add(run_id)
        self.accepted = AcceptedRun(run_id, prepared)
        self._change(Change.ACCEPTED)
        return [StartRun(run_id, prepared, ticket, token_ids, self.scope)]

    # -- what its run does ---------------------------------------------------------------------

    def _on_began(self, event: RunBegan) -> Effects:
        self._change(Change.STARTED)
        return [SAVE]  # the running turn is kept, should this process die

    def _on_grew(self, event: RunGrew) -> Effects:
        assert self.accepted is not None  # RUNNING has one
        self.accepted.grew = True
        return [CHECKPOINT]

    def _on_ended(self, event: RunEnded) -> Effects:
        accepted = self.accepted
        assert accepted is not None  # a busy state has one
        self.accepted = None
        self.last_active_at = self.clock()
        if event.kept:  # the chat holds its exchange: after the ones it was prompted after
            del self.turn_ids[accepted.prepared.history :]
            self.turn_ids.append(accepted.id)
        self._change(Change.ENDED)
        return [END_GRACE, SAVE]

    # -- what becomes of its connection --------------------------------------------------------

    def _on_dropped(self, event: Dropped) -> Effects:
        grace = event.grace_s > 0
        # a reply that has sent no token yet (queued, or before its first) has nothing to
        # resume: cancelled at once rather than hold a slot or a place in the queue; a resume
        # is told how it ended even so (its done, without asking)
        mid_reply = self.busy and grace and self.accepted is not None and self.accepted.grew
        detach = Detach(self.busy and grace)
        if not mid_reply:
            return [detach, StopRun(None)] if self.accepted is not None else [detach]
        self._change(Change.DROPPED)
        return [detach, SetGrace(event.grace_s)]

    def _on_taken_over(self, event: TakenOver) -> Effects:
        self.address, self.scope = event.address, event.scope
        if self.state in DETACHED_STATES:
            self._change(Change.RESUMED)
        return [END_GRACE]

    def _on_grace_over(self, event: GraceOver) -> Effects:
        log.info("session %s: nobody resumed within the grace period: cancelled", self.key)
        return [CANCEL_RUN]  # kept in the conversation as a cancelled exchange

    def _on_close(self, event: Close) -> Effects:
        if self.accepted is not None:
            return [END_GRACE, StopRun(event)]  # closed once the run ended
        self._change(Change.CLOSE)
        return [END_GRACE]


S, T = SessionCore, turn_requests  # the core's own handlers; the requests for a turn
# an input a state does not list is our bug: it cannot come there
UNEXPECTED: Rules = dict.fromkeys([*CLIENT_FRAMES.values(), *INPUTS], S._misuse)
# what a connection may send while a run waits or goes on
BUSY: Rules = {
    **UNEXPECTED,
    Prompt: S._refuse_busy,
    Image: S._on_image,
    Cancel: S._cancel_run,
    Reset: S._on_reset,
    Ping: S._on_ping,
    Configure: S._refuse_busy,
    Rewind: S._refuse_busy,
    Regenerate: S._refuse_busy,
    Converse: S._refuse_busy,
    Complete: S._refuse_busy,
    ToolResults: S._refuse_busy,
    GraceOver: S._drop,  # the timer went off as it was cancelled
}
# what every state a connection feeds answers alike
WHILE_OPEN: Rules = {
    ImageChecked: S._on_image_checked,
    Dropped: S._on_dropped,
    TakenOver: S._on_taken_over,
    Close: S._on_close,
}
# no connection feeds a detached session (a resume makes it RUNNING first) nor a closed one
DROPPED: Rules = dict.fromkeys([*CLIENT_FRAMES.values(), *INPUTS], S._drop)

# (state, input type) -> handler: the session's rules, one row per state.
SessionCore.RULES = {
    IDLE: {
        **UNEXPECTED,
        Prompt: T.on_prompt,
        Image: S._on_image,
        Cancel: S._cancel_finished,
        Reset: S._on_reset,
        Ping: S._on_ping,
        Configure: S._on_configure,
        Rewind: S._on_rewind,
        Regenerate: T.on_regenerate,
        ToolResults: T.on_tool_results,
        Converse: T.on_converse,
        Complete: T.on_complete,
        SystemSet: S._on_system_set,
        ConversationLoaded: T.on_conversation_loaded,
        TurnPrepared: S._on_turn_prepared,
        GraceOver: S._drop,
        **WHILE_OPEN,
    },
    QUEUED: {**BUSY, **WHILE_OPEN, RunBegan: S._on_began, RunEnded: S._on_ended},
    RUNNING: {**BUSY, **WHILE_OPEN, RunGrew: S._on_grew, RunEnded: S._on_ended},
    RUNNING_DETACHED: {
        **DROPPED,
        TakenOver: S._on_taken_over,
        Close: S._on_close,
        RunGrew: S._on_grew,
        RunEnded: S._on_ended,
        GraceOver: S._on_grace_over,
    },
    CLOSED: DROPPED,
}
