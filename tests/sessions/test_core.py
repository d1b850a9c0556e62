"""The session's rules (core.py), cell by cell and with no I/O: each input in each state gets the
effects, or the refusal, the table promises, and leaves the state ``TRANSITIONS`` names.
Synchronous: the core awaits nothing, so nothing here is awaited (no loop, no engine run)."""

from __future__ import annotations

from typing import Any, TypeAlias

import pytest
from wschat.protocol import (
    Busy,
    Cancel,
    ClientFrame,
    Configure,
    GenerationParams,
    Image,
    InvalidParams,
    NotRunning,
    Overloaded,
    Ping,
    Pong,
    Prompt,
    ProtocolError,
    Regenerate,
    Reset,
    Rewind,
    Rewound,
    SessionMisuse,
    TooLarge,
)
from wschat.protocol.frames import CLIENT_FRAMES
from wschat.server.engine import Chat, PreparedTurn, SamplingParams, Turn
from wschat.server.sessions.core import SessionCore
from wschat.server.sessions.effects import (
    CancelRun,
    CheckImage,
    Checkpoint,
    CompletionTurn,
    CountRewind,
    Detach,
    Effect,
    EndGrace,
    LoadConversation,
    PrepareTurn,
    PromptTurn,
    RegenerateTurn,
    Save,
    SendFrame,
    SetGrace,
    SetSystem,
    StartRun,
    StopRun,
)
from wschat.server.sessions.images import CheckedImage
from wschat.server.sessions.inputs import (
    INPUTS,
    Close,
    Complete,
    ConversationLoaded,
    Converse,
    Dropped,
    GraceOver,
    Input,
    ReplySaid,
    RunBegan,
    RunEnded,
    RunGrew,
    TakenOver,
    TurnPrepared,
    UserSaid,
)
from wschat.server.sessions.limits import PromptLimits
from wschat.server.sessions.slots import GenerationSlots
from wschat.server.sessions.states import TRANSITIONS, Change, SessionState
from wschat.server.settings import Settings

from tests.fakes.scripted import ScriptedEngine
from tests.protocol.vector_cases import PNG_1X1

IDLE, QUEUED, RUNNING, RUNNING_DETACHED, CLOSED = SessionState
SAMPLING = PromptLimits.of(Settings()).sampling(GenerationParams())


def new_core(max_queue: int = 4, **settings: Any) -> SessionCore:
    chat = Chat(ScriptedEngine(images=True), "s")
    limits = PromptLimits.of(Settings(**settings))
    return SessionCore("s", chat, GenerationSlots(1, max_queue), limits, address="a", scope="o")


def prepared(text: str = "hello") -> PreparedTurn:
    """A turn as the chat prepares one (the core reads only its place and images)."""
    return PreparedTurn(Turn(text, SAMPLING), 1, 3, [7], [], [2, 7, 3], [])


def prepare_of(core: SessionCore, frame: Prompt) -> PrepareTurn:
    (prepare,) = core.receive(frame)
    assert isinstance(prepare, PrepareTurn)
    return prepare


def accepted(core: SessionCore, gen_id: str = "g") -> StartRun:
    """A prompt taken to its run: what the driver does with the core's effects, by hand."""
    prepare = prepare_of(core, Prompt(gen_id, "hello"))
    (start,) = core.receive(TurnPrepared(prepare, prepared()))
    assert isinstance(start, StartRun)
    return start


def enter(state: SessionState) -> SessionCore:
    core = new_core()
    if state is CLOSED:
        core.receive(Close())
    if state in (QUEUED, RUNNING, RUNNING_DETACHED):
        accepted(core)
    if state in (RUNNING, RUNNING_DETACHED):
        core.receive(RunBegan())
    if state is RUNNING_DETACHED:
        core.receive(RunGrew())  # a token went out: something to resume
        core.receive(Dropped(60.0))
    assert core.state is state
    return core


def kinds(effects: list[Effect]) -> list[type]:
    return [type(effect) for effect in effects]


FRAMES: dict[str, ClientFrame] = {
    "prompt": Prompt("p2", "again"),
    "image": Image("img", PNG_1X1),
    "cancel": Cancel(),
    "cancel_unknown": Cancel("never-sent"),
    "reset": Reset(),
    "ping": Ping(7),
    "configure": Configure("be brief"),
    "rewind": Rewind(0),
    "rewind_past_the_start": Rewind(1),
    "regenerate": Regenerate("r2"),
}

Answer: TypeAlias = list[type] | type[ProtocolError]
BUSY: dict[str, Answer] = {
    "prompt": Busy,
    "image": [CheckImage],
    "cancel": [CancelRun],
    "cancel_unknown": NotRunning,
    "reset": [StopRun],  # the run ends first, its done sent; then the reset
    "ping": [SendFrame],
    "configure": Busy,
    "rewind": Busy,
    "rewind_past_the_start": Busy,
    "regenerate": Busy,
}
# (state, frame) -> the effects it asks for (their types), or the refusal it raises
EXPECTED: dict[tuple[SessionState, str], Answer] = {
    (IDLE, "prompt"): [PrepareTurn],
    (IDLE, "image"): [CheckImage],
    (IDLE, "cancel"): [],
    (IDLE, "cancel_unknown"): NotRunning,
    (IDLE, "reset"): [SendFrame, Save],
    (IDLE, "ping"): [SendFrame],
    (IDLE, "configure"): [SetSystem],
    (IDLE, "rewind"): [CountRewind, SendFrame, Save],
    (IDLE, "rewind_past_the_start"): InvalidParams,  # a new session holds no exchange
    (IDLE, "regenerate"): InvalidParams,  # nothing to regenerate
    **{(busy, name): answer for busy in (QUEUED, RUNNING) for name, answer in BUSY.items()},
    # nothing reaches a detached session (no connection feeds it); were it to, it is dropped
    **{(state, name): [] for state in (RUNNING_DETACHED, CLOSED) for name in FRAMES},
}


def test_every_state_has_a_rule_for_every_input() -> None:
    every = {*CLIENT_FRAMES.values(), *INPUTS}
    assert {state: set(SessionCore.RULES[state]) for state in SessionState} == {
        state: every for state in SessionState
    }


def case_order(case: tuple[SessionState, str]) -> tuple[str, str]:
    return str(case[0].value), case[1]


CASES: list[tuple[SessionState, str]] = sorted(EXPECTED, key=case_order)


@pytest.mark.parametrize(("state", "name"), CASES)
def test_each_frame_in_each_state_gets_the_answer_of_the_table(
    state: SessionState, name: str
) -> None:
    core = enter(state)
    expected = EXPECTED[state, name]
    if isinstance(expected, type):
        with pytest.raises(expected):
            core.receive(FRAMES[name])
    else:
        assert kinds(core.receive(FRAMES[name])) == expected
    assert core.state is state  # a frame alone moves no state: what it asks for does


def test_a_busy_session_answers_what_the_table_says_with_the_frame_itself() -> None:
    core = enter(RUNNING)
    assert core.receive(Ping(7)) == [SendFrame(Pong(7))]
    assert core.receive(Reset()) == [StopRun(Reset())]
    with pytest.raises(Busy) as busy:
        core.receive(Prompt("p2", "again"))
    assert busy.value.id == "p2"


def test_the_transition_table_allows_close_from_every_state_and_nothing_out_of_closed() -> None:
    assert all(TRANSITIONS[state][Change.CLOSE] is CLOSED for state in SessionState)
    assert set(TRANSITIONS[CLOSED]) == {Change.CLOSE}


def test_a_change_the_table_does_not_list_is_our_misuse_not_the_peers() -> None:
    core = new_core()
    with pytest.raises(SessionMisuse) as raised:
        core._change(Change.STARTED)  # a slot granted to a session with no prompt
    assert not isinstance(raised.value, ProtocolError)
    assert core.state is IDLE


@pytest.mark.parametrize(
    ("state", "event"), [(IDLE, RunBegan()), (IDLE, RunEnded(True)), (RUNNING, RunBegan())]
)
def test_an_input_a_state_does_not_expect_is_our_misuse_naming_both(
    state: SessionState, event: Input
) -> None:
    core = enter(state)
    with pytest.raises(SessionMisuse) as raised:
        core.receive(event)
    assert str(raised.value) == f"session {state.value}: {type(event).__name__} is not expected"


def test_a_prompt_is_prepared_then_queued_then_runs_then_ends_as_the_table_says() -> None:
    core = new_core()
    (prepare,) = core.receive(Prompt("g", "hello", params=GenerationParams(token_ids=True)))
    assert prepare == PrepareTurn("g", PromptTurn("hello", (), (), SAMPLING), token_ids=True)
    assert (core.state, core.busy, "g" in core.used_ids) == (IDLE, False, False)
    turn = prepared()
    (start,) = core.receive(TurnPrepared(prepare, turn))
    assert isinstance(start, StartRun)
    assert (start.id, start.prepared, start.token_ids, start.scope) == ("g", turn, True, "o")
    assert (core.state, core.busy, "g" in core.used_ids) == (QUEUED, True, True)
    assert core.receive(RunBegan()) == [Save()]  # the running turn is kept from now on
    assert core.receive(RunGrew()) == [Checkpoint()]
    assert core.receive(RunEnded(kept=True)) == [EndGrace(), Save()]
    assert (core.state, core.busy, core.turn_ids, core.last_prompt) == (IDLE, False, ["g"], "g")


def test_a_prompt_the_queue_has_no_room_for_is_overloaded_and_changes_nothing() -> None:
    core = new_core(max_queue=0)
    hog = core.slots.enqueue("another")
    prepare = prepare_of(core, Prompt("g", "hello"))
    with pytest.raises(Overloaded):
        core.receive(TurnPrepared(prepare, prepared()))
    assert (core.state, core.used_ids, core.accepted) == (IDLE, set(), None)
    core.slots.release(hog)


def test_a_prompt_with_no_text_and_nothing_staged_is_invalid_params_with_its_id() -> None:
    with pytest.raises(InvalidParams) as raised:
        new_core().receive(Prompt("g", ""))
    assert (raised.value.id, raised.value.message) == ("g", "a prompt needs text or images")


def test_a_reused_id_is_invalid_params_and_a_text_over_the_limit_too_large() -> None:
    core = new_core(max_prompt_bytes=8)
    accepted(core, "g")
    core.receive(RunEnded(kept=False))
    with pytest.raises(InvalidParams) as reused:
        core.receive(Prompt("g", "again"))
    assert reused.value.message == "id 'g' was already used in this session"
    with pytest.raises(TooLarge) as large:
        core.receive(Prompt("h", "nine byte"))
    assert (large.value.id, large.value.message) == ("h", "prompt text is over 8 bytes")


def test_an_api_conversation_is_loaded_then_its_last_turn_is_a_prompt() -> None:
    core = new_core()
    history = (UserSaid("hi"), ReplySaid("hello", (5, 6)))
    request = Converse("c", "be brief", history, UserSaid("and?", (PNG_1X1,)))
    assert core.receive(request) == [LoadConversation(request)]
    (prepare,) = core.receive(ConversationLoaded(LoadConversation(request)))
    assert prepare == PrepareTurn("c", PromptTurn("and?", (PNG_1X1,), (), SAMPLING), False)


def test_an_api_conversation_with_a_message_over_the_limit_is_too_large() -> None:
    core = new_core(max_prompt_bytes=8)
    request = Converse("c", None, (UserSaid("nine byte"), ReplySaid("ok")), UserSaid("and?"))
    with pytest.raises(TooLarge) as raised:
        core.receive(request)
    assert (raised.value.id, raised.value.message) == (None, "a message's text is over 8 bytes")


def test_a_completion_of_token_ids_is_a_turn_of_its_own_kind() -> None:
    core = new_core()
    (prepare,) = core.receive(Complete("k", None, (2, 7, 3)))
    assert prepare == PrepareTurn("k", CompletionTurn(None, (2, 7, 3), SAMPLING), False)
    with pytest.raises(InvalidParams) as empty:
        core.receive(Complete("e", None, None))
    assert empty.value.message == "a prompt needs text or token ids"


def test_a_regenerate_is_a_turn_of_its_own_kind_counted_once_accepted() -> None:
    core = new_core()
    start = accepted(core, "p1")
    core.chat.conversation.add_exchange(start.prepared.user_ids, [], [], [9, 1])
    core.receive(RunEnded(kept=True))
    core.staged.append(CheckedImage("an image", 1, 1, "png"))
    (prepare,) = core.receive(Regenerate("r"))
    assert prepare == PrepareTurn("r", RegenerateTurn(SAMPLING), False)
    effects = core.receive(TurnPrepared(prepare, prepared()))
    assert kinds(effects) == [StartRun, CountRewind] and effects[1] == CountRewind(True)
    assert core.state is QUEUED and len(core.staged) == 1  # left for the next prompt


def test_a_rewind_keeps_the_ids_of_the_exchanges_it_keeps() -> None:
    core = new_core()
    core.turn_ids.extend(["p1", "p2"])
    for _ in range(2):
        core.chat.conversation.add_exchange([7], [], [], [9, 1])
    assert core.receive(Rewind(1)) == [CountRewind(False), SendFrame(Rewound(1)), Save()]
    assert (core.turn_ids, core.chat.turns) == (["p1"], 1)


def test_a_drop_mid_reply_then_a_resume_move_the_session_as_the_table_says() -> None:
    core = enter(RUNNING)
    core.receive(RunGrew())
    assert core.receive(Dropped(60.0)) == [Detach(in_flight=True), SetGrace(60.0)]
    assert core.state is RUNNING_DETACHED
    assert core.receive(TakenOver("b", "p")) == [EndGrace()]
    assert (core.state, core.address, core.scope) == (RUNNING, "b", "p")


@pytest.mark.parametrize("state", [QUEUED, RUNNING])
def test_a_drop_before_the_first_token_stops_the_reply_and_the_session_ends_idle(
    state: SessionState,
) -> None:
    core = enter(state)
    assert core.receive(Dropped(60.0)) == [Detach(in_flight=True), StopRun(None)]
    assert core.state is state  # until the run ended
    assert core.receive(RunEnded(kept=False)) == [EndGrace(), Save()]
    assert core.state is IDLE


def test_a_drop_with_no_grace_stops_the_reply_and_keeps_nothing_for_a_resume() -> None:
    core = enter(RUNNING)
    core.receive(RunGrew())
    assert core.receive(Dropped(0.0)) == [Detach(in_flight=False), StopRun(None)]


def test_the_grace_running_out_cancels_the_reply_which_is_kept_as_it_ends() -> None:
    core = enter(RUNNING_DETACHED)
    assert core.receive(GraceOver()) == [CancelRun()]
    assert core.receive(RunEnded(kept=True)) == [EndGrace(), Save()]
    assert (core.state, core.last_prompt) == (IDLE, "g")


def test_a_close_stops_the_run_first_then_closes_and_drops_what_comes_after() -> None:
    core = enter(RUNNING)
    assert core.receive(Close()) == [EndGrace(), StopRun(Close())]
    core.receive(RunEnded(kept=False))
    assert core.receive(Close()) == [EndGrace()]
    assert core.state is CLOSED
    prepare = prepare_of(new_core(), Prompt("late", "hi"))
    assert core.receive(TurnPrepared(prepare, prepared())) == []  # prepared as it closed
    assert core.receive(Close()) == [] and core.state is CLOSED


def test_held_images_count_a_queued_prompts_until_its_run_holds_them() -> None:
    core = new_core()
    turn = PreparedTurn(Turn("look", SAMPLING, ["an image"]), 1, 3, [7], [[0]], [2, 7, 3], [])
    core.receive(TurnPrepared(prepare_of(core, Prompt("g", "look")), turn))
    assert core.held_images() == ["an image"]  # queued: the chat has not seen it
    core.receive(RunBegan())
    assert core.held_images() == []  # the chat holds it once the run starts (not here)


def test_sampling_fills_what_the_prompt_and_the_defaults_leave_with_the_servers() -> None:
    assert SamplingParams(max_new_tokens=Settings().default_max_new_tokens) == SAMPLING
