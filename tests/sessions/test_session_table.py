"""The session's table, cell by cell: each frame type in each state gets the answer the table
promises, and the state it leaves is the one ``TRANSITIONS`` names. In-process (no socket): the
session's outbox is a recorder."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from wschat.protocol import (
    Busy,
    Cancel,
    ClientFrame,
    Configure,
    Configured,
    Done,
    FinishReason,
    Image,
    ImageOk,
    InvalidParams,
    NotRunning,
    Ping,
    Pong,
    Prompt,
    ProtocolError,
    Regenerate,
    Reset,
    ResetOk,
    Rewind,
    Rewound,
    SessionMisuse,
    Start,
    Token,
)
from wschat.protocol.frames import CLIENT_FRAMES
from wschat.server.sessions.session import TRANSITIONS, Change, Session, SessionState
from wschat.server.sessions.slots import GenerationSlots, Ticket
from wschat.server.settings import Settings

from tests.fakes.scripted import Script, ScriptedEngine
from tests.protocol.vector_cases import PNG_1X1
from tests.support import wait_until

from .test_session import Recorder, done_of

IDLE, QUEUED, RUNNING, RUNNING_DETACHED, CLOSED = SessionState
ATTACHED = {RUNNING_DETACHED: RUNNING}


class Table:
    """A session driven into one state, with the slot ticket that keeps it QUEUED."""

    def __init__(self, delay_s: float = 0.02) -> None:
        engine = ScriptedEngine(
            lambda r: Script([f" t{i}" for i in range(200)], delay_s=delay_s), images=True
        )
        self.slots = GenerationSlots(1, 4)
        self.session = Session("s", engine, self.slots, Settings())
        self.rec = Recorder()
        self.hog: Ticket | None = None

    async def enter(self, state: SessionState) -> None:
        await self.session.relay.attach(self.rec)
        attached = ATTACHED.get(state, state)
        if attached is QUEUED:
            self.hog = self.slots.enqueue()  # another session holds the only slot
        if attached in (QUEUED, RUNNING):
            await self.session.handle(Prompt("g", "hello"))
        if attached is RUNNING:
            await self.rec.wait_for(lambda f: isinstance(f, Start))
        if state in ATTACHED:
            await self.rec.wait_for(lambda f: isinstance(f, Token))  # something to resume
            await self.session.disconnect(grace_s=60)  # dropped: the reply goes on
        if state is CLOSED:
            await self.session.close()
        assert self.session.state is state

    async def leave(self) -> None:
        if self.hog is not None:
            self.slots.release(self.hog)
        await self.session.close()


@pytest.fixture
async def table() -> AsyncIterator[Table]:
    t = Table()
    try:
        yield t
    finally:
        async with asyncio.timeout(10):
            await t.leave()


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

# (state, frame) -> what comes back: a frame type, an error class, or None (nothing)
EXPECTED: dict[tuple[SessionState, str], type[ProtocolError] | type | None] = {
    (IDLE, "prompt"): Start,
    (IDLE, "image"): ImageOk,
    (IDLE, "cancel"): None,
    (IDLE, "cancel_unknown"): NotRunning,
    (IDLE, "reset"): ResetOk,
    (IDLE, "ping"): Pong,
    (IDLE, "configure"): Configured,
    (IDLE, "rewind"): Rewound,
    (IDLE, "rewind_past_the_start"): InvalidParams,  # a new session holds no exchange
    (IDLE, "regenerate"): InvalidParams,  # nothing to regenerate
    **{
        (busy, name): answer
        for busy in (QUEUED, RUNNING)
        for name, answer in {
            "prompt": Busy,
            "image": ImageOk,
            "cancel": Done,
            "cancel_unknown": NotRunning,
            "reset": ResetOk,
            "ping": Pong,
            "configure": Busy,
            "rewind": Busy,
            "rewind_past_the_start": Busy,
            "regenerate": Busy,
        }.items()
    },
    # nothing reaches a detached session (no connection feeds it); were it to, it is dropped
    **{(state, name): None for state in (*ATTACHED, CLOSED) for name in FRAMES},
}
# where each cell leaves the session, once what it started has settled
AFTER: dict[tuple[SessionState, str], SessionState] = {
    (IDLE, "prompt"): RUNNING,
    **{(s, "cancel"): IDLE for s in (QUEUED, RUNNING)},
    **{(s, "reset"): IDLE for s in (QUEUED, RUNNING)},
}


def test_every_state_has_a_rule_for_every_client_frame_type() -> None:
    every = set(CLIENT_FRAMES.values())
    assert {state: set(Session.RULES[state]) for state in SessionState} == {
        state: every for state in SessionState
    }


def case_order(case: tuple[SessionState, str]) -> tuple[str, str]:
    return str(case[0].value), case[1]


CASES: list[tuple[SessionState, str]] = sorted(EXPECTED, key=case_order)


@pytest.mark.parametrize(("state", "name"), CASES)
async def test_each_frame_in_each_state_gets_the_answer_of_the_table(
    table: Table, state: SessionState, name: str
) -> None:
    await table.enter(state)
    start = len(table.rec.frames)
    expected = EXPECTED[state, name]
    frame = FRAMES[name]
    if isinstance(expected, type) and issubclass(expected, ProtocolError):
        with pytest.raises(expected):
            await table.session.handle(frame)
        assert table.session.state is state  # a refused frame changes nothing
        return
    await table.session.handle(frame)
    if expected is None:
        await asyncio.sleep(0)
        assert table.rec.frames[start:] == []
    else:
        answer = await table.rec.wait_for(
            lambda f: table.rec.frames.index(f) >= start and isinstance(f, expected)
        )
        if isinstance(answer, Done):
            assert answer.reason is FinishReason.CANCELLED
    if expected is Start:
        assert table.session.busy
    if name in ("cancel", "reset") and state in (QUEUED, RUNNING):
        await done_of(table.rec, "g")
        await wait_until(lambda: not table.session.busy)
    assert table.session.state is AFTER.get((state, name), state)


def test_the_transition_table_allows_close_from_every_state_and_nothing_out_of_closed() -> None:
    assert all(TRANSITIONS[state][Change.CLOSE] is CLOSED for state in SessionState)
    assert set(TRANSITIONS[CLOSED]) == {Change.CLOSE}


async def test_a_change_the_table_does_not_list_is_our_misuse_not_the_peers() -> None:
    session = Table().session
    with pytest.raises(SessionMisuse) as raised:
        session._change(Change.STARTED)  # a slot granted to a session with no prompt
    assert not isinstance(raised.value, ProtocolError)
    assert session.state is IDLE


async def test_busy_follows_the_state_alone(table: Table) -> None:
    assert not table.session.busy
    await table.enter(QUEUED)
    assert table.session.busy and table.session.state is QUEUED
    table.slots.release(table.hog)
    table.hog = None
    await table.rec.wait_for(lambda f: isinstance(f, Start))
    assert table.session.busy and table.session.state is RUNNING
    await table.session.handle(Cancel())
    await done_of(table.rec, "g")
    await wait_until(lambda: table.session.state is IDLE)
    assert not table.session.busy and table.session.run is None


async def test_a_drop_mid_reply_then_a_resume_move_the_session_as_the_table_says(
    table: Table,
) -> None:
    await table.enter(RUNNING_DETACHED)
    catch_up = table.session.resume(0)
    assert table.session.state is RUNNING
    assert catch_up.reply == "g" and isinstance(catch_up.frames[0], Token)


@pytest.mark.parametrize("state", [QUEUED, RUNNING])
async def test_a_drop_before_the_first_token_ends_the_reply_and_leaves_the_session_idle(
    state: SessionState,
) -> None:
    table = Table(delay_s=1.0)  # RUNNING is entered at its start, a second before any token
    try:
        await table.enter(state)
        await table.session.disconnect(grace_s=60)
        assert table.session.state is IDLE and table.session.run is None
        assert table.session.held is None  # nothing keeps its connection's place
        catch_up = table.session.resume(None)  # a drop: the resume is told how it ended
        assert catch_up.reply == "g" and isinstance(catch_up.frames[-1], Done)
    finally:
        async with asyncio.timeout(10):
            await table.leave()


async def test_a_drop_with_no_grace_ends_the_reply_and_leaves_the_session_idle(
    table: Table,
) -> None:
    await table.enter(RUNNING)
    await table.session.disconnect(grace_s=0.0)
    assert table.session.state is IDLE and table.session.run is None
    assert table.session.resume(None).reply is None
    assert table.session.state is IDLE
