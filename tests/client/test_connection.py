"""``FrameRouter``: where each server frame goes (no I/O: frames are fed in directly)."""

from __future__ import annotations

import pytest
from wschat.client import (
    BusyError,
    ConnectionClosedError,
    NotRunningError,
    OverloadedError,
    Reply,
    ReplyLostError,
)
from wschat.client.connection import FrameRouter
from wschat.protocol import (
    Configured,
    Done,
    Error,
    ErrorCode,
    FinishReason,
    GoAway,
    Pong,
    Queued,
    ResetOk,
    Resumed,
    Rewound,
    Start,
    Timing,
    Token,
    Usage,
)


def reply(id: str = "r1") -> Reply:
    return Reply(id, send_cancel=lambda _: None)


def done(
    id: str, text: str, reason: FinishReason = FinishReason.STOP, turn: int | None = None
) -> Done:
    return Done(id, reason, text, Usage(3, 2, 0), Timing(0.0, 1.0, 10.0, 2.0), turn)


async def test_frames_with_an_id_feed_their_reply_until_done() -> None:
    router = FrameRouter()
    r = reply()
    router.add_reply(r)
    for frame in (Queued("r1", 1), Start("r1", 3, 0, 1.0), Token("r1", " a", 1)):
        router.route(frame)
    assert r.position is None and r.text == " a" and not r.finished
    router.route(done("r1", " a"))
    assert r.finished and router.replies == {}
    router.route(Token("r1", " late", 2))
    assert list(router.unrouted) == [Token("r1", " late", 2)] and r.text == " a"


async def test_answers_without_id_go_to_the_oldest_request_expecting_them() -> None:
    router = FrameRouter()
    configure = router.expect(Configured)
    reset = router.expect(ResetOk)
    ping = router.expect(Pong)
    router.route(Configured())
    router.route(ResetOk())
    router.route(Pong(7))
    assert configure.future.result() == Configured()
    assert reset.future.result() == ResetOk()
    assert ping.future.result() == Pong(7)


async def test_error_without_id_fails_the_oldest_waiting_request_only() -> None:
    router = FrameRouter()
    configure = router.expect(Configured)
    ping = router.expect(Pong)
    router.route(Error(ErrorCode.BUSY, "a generation is already running"))
    with pytest.raises(BusyError):
        configure.future.result()
    assert not ping.future.done()


async def test_error_with_a_request_id_fails_that_request() -> None:
    router = FrameRouter()
    cancel = router.expect(None, "c1")
    router.route(Error(ErrorCode.NOT_RUNNING, "no generation 'c1'", "c1"))
    with pytest.raises(NotRunningError):
        cancel.future.result()


async def test_error_for_a_refused_prompt_ends_its_reply_but_not_an_accepted_one() -> None:
    router = FrameRouter()
    refused, accepted = reply("a"), reply("b")
    router.add_reply(refused)
    router.add_reply(accepted)
    router.route(Error(ErrorCode.BUSY, "busy", "a"))
    router.route(Start("b", 3, 0, 0.0))
    router.route(Error(ErrorCode.INTERNAL, "generation failed", "b"))
    assert refused.finished and isinstance(refused.error, BusyError)
    assert not accepted.finished  # its ``done`` is still to come
    router.route(done("b", "", FinishReason.ERROR))
    assert accepted.finished and list(router.replies) == []


async def test_unclaimed_error_is_kept_for_the_close_that_follows() -> None:
    router = FrameRouter()
    r = reply()
    router.add_reply(r)
    router.route(Error(ErrorCode.OVERLOADED, "more than 50 frames in a second"))
    assert isinstance(router.unclaimed_error, OverloadedError)
    closed = ConnectionClosedError(1008, "too many frames", error=router.unclaimed_error)
    router.close(closed)
    assert r.error is closed and str(closed) == (
        "connection closed (code 1008): too many frames after error overloaded:"
        " more than 50 frames in a second"
    )


async def test_close_ends_every_reply_and_request_still_waiting() -> None:
    router = FrameRouter()
    r = reply()
    router.add_reply(r)
    waiters = [router.expect(Pong), router.expect(None, "i1")]
    closed = ConnectionClosedError(1006)
    router.close(closed)
    assert r.finished and r.error is closed and router.closed is closed
    for waiter in waiters:
        assert waiter.future.exception() is closed


async def test_goaway_is_stored_and_handed_to_the_callback() -> None:
    seen: list[GoAway] = []
    router = FrameRouter(on_goaway=seen.append)
    router.route(GoAway(2500))
    assert router.goaway == GoAway(2500) and seen == [GoAway(2500)]


async def test_after_a_resume_a_lost_reply_ends_and_a_prompt_never_taken_is_sent_again() -> None:
    router = FrameRouter()
    coming, kept, never, unsent = reply("a"), reply("b"), reply("c"), reply("d")
    for r in (coming, kept, never, unsent):
        router.add_reply(r)
    never.prompt_frame = b"the prompt"  # not taken by the server yet: kept to send again
    for r in (coming, kept, never):
        r.sent = True
    waiting = router.expect(Pong)
    router.fail_requests(ConnectionClosedError(1006, "the connection dropped"))
    again = router.resumed(Resumed(last_prompt="b", reply="a"))
    assert not coming.finished and not unsent.finished and not never.finished
    assert isinstance(kept.error, ReplyLostError) and kept.error.kept
    assert again == [never] and not never.sent
    assert isinstance(waiting.future.exception(), ConnectionClosedError)
    assert sorted(router.replies) == ["a", "c", "d"]


async def test_a_token_frame_at_or_below_the_last_index_is_shown_once() -> None:
    router = FrameRouter()
    r = reply()
    router.add_reply(r)
    for text, index in (("a", 1), ("b", 2), ("b", 2), ("c", 3)):
        router.route(Token("r1", text, index))
    assert r.text == "abc" and r.last_index == 3


async def test_turns_follow_done_rewound_reset_and_a_resume() -> None:
    router = FrameRouter()
    for n in (1, 2, 3):
        router.route(done(f"r{n}", " a", turn=n))
    assert router.turns == 3
    router.expect(Rewound)
    router.route(Rewound(1))
    assert router.turns == 1
    router.route(done("failed", "", FinishReason.ERROR))  # not kept: nothing changes
    router.route(done("waited", "", FinishReason.CANCELLED))  # cancelled while queued
    assert router.turns == 1
    router.route(done("again", " b", turn=1))  # a regenerate: the exchange it replaced
    assert router.turns == 1
    router.expect(ResetOk)
    router.route(ResetOk())
    assert router.turns == 0
    router.resumed(Resumed("r9", None, 4))
    assert router.turns == 4


async def test_turns_are_unknown_after_a_kept_reply_a_server_did_not_number() -> None:
    router = FrameRouter(turns=2)
    started = reply("started")
    router.add_reply(started)
    router.route(Start("started", 3, 0, 1.0))
    router.route(done("started", " a", FinishReason.CANCELLED))  # kept, yet no turn
    assert router.turns is None
    router.resumed(Resumed(None, None))  # a server older than ``rewind``
    assert router.turns is None
