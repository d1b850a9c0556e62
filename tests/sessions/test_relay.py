"""``Relay``: what a resuming client is sent of the reply it was getting when its connection
dropped (PROTOCOL.md section 10): the text after the index it names in one ``token`` frame,
nothing twice, then the rest in order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from wschat.protocol import (
    Done,
    Error,
    ErrorCode,
    FinishReason,
    Frame,
    Queued,
    Start,
    Timing,
    Token,
    TokenLogprobs,
    Usage,
)
from wschat.server.sessions.relay import Relay, ReplyRecord


class Sink:
    def __init__(self) -> None:
        self.frames: list[Frame] = []

    async def __call__(self, frame: Frame) -> None:
        self.frames.append(frame)


def done(id: str, text: str, reason: FinishReason = FinishReason.STOP) -> Done:
    return Done(id, reason, text, Usage(3, 5, 0), Timing(0.0, None, 0.0, 1.0))


class Run:
    """What a generation run does with its reply's frames: records each token frame (and ids
    that came without text), then sends it through the relay."""

    def __init__(self, relay: Relay, reply: str) -> None:
        self.relay, self.record = relay, ReplyRecord()
        relay.begin(reply, self.record)

    async def token(self, frame: Token) -> None:
        self.record.add(frame.ids or (), frame)
        await self.relay(frame)


async def attached() -> tuple[Relay, Sink, Run]:
    relay, sink = Relay(), Sink()
    await relay.attach(sink)
    return relay, sink, Run(relay, "r")


async def test_a_resume_after_a_drop_mid_reply_gets_the_text_after_its_index_in_one_frame() -> None:
    relay, sink, run = await attached()
    await relay(Start("r", 3, 0, 0.0))
    for text, index in (("a", 1), ("bc", 3), ("d", 4)):
        await run.token(Token("r", text, index))
    relay.detach(mid_reply=True)
    await run.token(Token("r", "e", 5))  # while detached: held
    assert len(sink.frames) == 4
    catch_up = relay.catch_up(1)
    assert catch_up.reply == "r"
    assert catch_up.frames == [Token("r", "bcde", 5)]


async def test_a_last_between_frames_counts_as_the_boundary_below_and_past_the_end_as_the_end() -> (
    None
):
    relay, _, run = await attached()
    for text, index in (("a", 1), ("bc", 3), ("d", 4)):
        await run.token(Token("r", text, index))
    relay.detach(mid_reply=True)
    assert relay.catch_up(2).frames == [Token("r", "bcd", 4)]  # no frame ended at 2: from 1
    relay.detach(mid_reply=True)
    assert relay.catch_up(9).frames == []
    relay.detach(mid_reply=True)
    assert relay.catch_up(None).frames == [Token("r", "abcd", 4)]  # absent: none received


async def test_the_replayed_frame_carries_the_ids_of_the_frames_it_merges() -> None:
    relay, _, run = await attached()
    await run.token(Token("r", "a", 1, (10,)))
    await run.token(Token("r", "b", 3, (11, 12)))
    relay.detach(mid_reply=True)
    assert relay.catch_up(0).frames == [Token("r", "ab", 3, (10, 11, 12))]


async def test_ids_that_came_without_text_are_checkpointed_but_never_replayed() -> None:
    relay, _, run = await attached()
    await run.token(Token("r", "a", 1, (10,)))
    run.record.add((11,), None)  # no text: no frame, the next index jumps
    await run.token(Token("r", "b", 3, (12,)))
    run.record.add((1,), None)  # the token that ended the reply
    relay.detach(mid_reply=True)
    assert relay.catch_up(0).frames == [Token("r", "ab", 3, (10, 12))]  # as the frames were
    assert list(run.record.ids) == [10, 11, 12, 1]  # the reply as generated
    assert run.record.text.join() == "ab"


def test_a_settled_reply_keeps_its_ids_only_where_its_frames_carried_them() -> None:
    plain, shown = ReplyRecord(), ReplyRecord()
    plain.add((10, 11), Token("r", "ab", 2, None))
    shown.add((10, 11), Token("r", "ab", 2, (10, 11)))
    plain.settle()
    shown.settle()
    assert list(plain.ids) == [] and plain.after("r", 0) == Token("r", "ab", 2, None)
    assert list(shown.ids) == [10, 11] and shown.after("r", 0) == Token("r", "ab", 2, (10, 11))


async def test_frames_held_while_detached_open_the_catch_up_and_the_ending_closes_it() -> None:
    relay, sink, run = await attached()
    await relay(Queued("r", 1))
    relay.detach(mid_reply=True)
    await relay(Start("r", 3, 0, 1.0))
    await run.token(Token("r", "a", 1))
    await relay(Error(ErrorCode.INTERNAL, "generation failed", "r"))
    await relay(done("r", "a", FinishReason.ERROR))
    assert sink.frames == [Queued("r", 1)]
    catch_up = relay.catch_up(0)
    assert [type(f) for f in catch_up.frames] == [Start, Token, Error, Done]


async def test_frames_sent_between_the_catch_up_and_attach_follow_it_in_order() -> None:
    relay, _, run = await attached()
    await run.token(Token("r", "a", 1))
    relay.detach(mid_reply=True)
    catch_up = relay.catch_up(0)
    await run.token(Token("r", "b", 2))  # live, while the catch-up is being sent
    await relay(done("r", "ab"))
    sink = Sink()
    await relay.attach(sink)
    await relay(Token("x", "late", 1))  # after attach: straight through
    assert catch_up.frames == [Token("r", "a", 1)]
    assert sink.frames == [Token("r", "b", 2), done("r", "ab"), Token("x", "late", 1)]


async def test_no_reply_in_flight_and_no_last_means_no_catch_up() -> None:
    relay, _, run = await attached()
    await run.token(Token("r", "a", 1))
    await relay(done("r", "a"))
    relay.detach(mid_reply=False)
    assert relay.catch_up(None).reply is None
    assert relay.catch_up(None).frames == []


async def test_a_client_that_names_its_last_index_gets_a_done_it_may_have_missed() -> None:
    relay, _, run = await attached()
    await run.token(Token("r", "a", 1))
    await run.token(Token("r", "b", 2))
    await relay(done("r", "ab"))  # sent, maybe lost in flight with the connection
    relay.detach(mid_reply=False)
    assert relay.catch_up(1).frames == [Token("r", "b", 2), done("r", "ab")]


async def test_a_new_prompt_forgets_the_last_reply() -> None:
    relay, _, run = await attached()
    await run.token(Token("r", "a", 1))
    Run(relay, "s")
    relay.detach(mid_reply=True)
    catch_up = relay.catch_up(0)
    assert (catch_up.reply, catch_up.frames) == ("s", [])


async def ended_detached(ids: bool) -> Relay:
    """A reply of three frames (their ids shown or not) that ended after its connection dropped."""
    relay, _, run = await attached()
    for text, index, shown in (("a", 1, (10,)), ("bc", 3, (11, 12)), ("d", 4, (13,))):
        await run.token(Token("r", text, index, shown if ids else None))
    relay.detach(mid_reply=True)
    await relay(Error(ErrorCode.INTERNAL, "generation failed", "r"))
    await relay(done("r", "abcd", FinishReason.ERROR))
    run.record.settle()
    return relay


async def test_a_reply_that_ended_detached_is_exported_and_restored_with_its_catch_up() -> None:
    for ids in (False, True):
        relay = await ended_detached(ids)
        kept = relay.export()
        assert kept is not None
        restored = Relay()
        restored.restore(kept)
        for last in (None, 0, 1, 3, 4):
            assert restored.catch_up(last) == relay.catch_up(last)


async def test_only_a_reply_that_ended_with_no_connection_is_exported() -> None:
    relay, _, run = await attached()
    await run.token(Token("r", "a", 1))
    assert relay.export() is None  # a connection is attached
    relay.detach(mid_reply=True)
    assert relay.export() is None  # it runs on
    await relay(done("r", "a"))
    assert relay.export() is not None


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda kept: kept["record"]["frames"].reverse(), "indexes are not rising"),
        (lambda kept: kept["record"]["frames"][-1].__setitem__(1, 99), "ends outside its text"),
        (lambda kept: kept["record"].__setitem__("text", "abcde"), "do not cover its text"),
        (lambda kept: kept["ending"].__setitem__(0, b"\x81\xa4type\xa4pong"), "not its error"),
        (lambda kept: kept.__setitem__("reply", 7), "without its id"),
        (lambda kept: kept["ending"].__setitem__(0, b"\xc1"), "not a kept reply"),
    ],
    ids=["falling", "past the text", "uncovered text", "not an ending", "no id", "not a frame"],
)
async def test_a_made_up_kept_reply_is_refused_and_changes_nothing(
    tamper: Callable[[dict[str, Any]], None], message: str
) -> None:
    kept = (await ended_detached(True)).export()
    assert kept is not None
    tamper(kept)
    relay = Relay()
    with pytest.raises(ValueError, match=message):
        relay.restore(kept)
    assert (relay.reply, relay.catch_up(0).frames) == (None, [])


def test_every_sender_in_the_sessions_layer_takes_the_one_send_type() -> None:
    from wschat.server.sessions import error_boundary, generation, relay, session

    for module in (generation, relay, session):
        assert module.Send is error_boundary.Send, module.__name__


def logprobs_of(ids: tuple[int, ...], top: int) -> TokenLogprobs:
    """Made-up logprobs for ``ids``: token i at -i, its alternatives at -i-1, -i-2, ..."""
    names = tuple(f"t{i}" for i in ids)
    alternatives = [(i * 10 + k, -i - 1.0 - k) for i in ids for k in range(top)]
    return TokenLogprobs(
        ids,
        names,
        tuple(n.encode() for n in names),
        tuple(-float(i) for i in ids),
        top,
        tuple(a for a, _ in alternatives),
        tuple(f"a{a}" for a, _ in alternatives),
        tuple(f"a{a}".encode() for a, _ in alternatives),
        tuple(v for _, v in alternatives),
    )


async def test_the_caught_up_frame_joins_the_logprobs_of_the_frames_it_merges() -> None:
    relay, _, run = await attached()
    for text, ids in (("a", (1,)), ("bc", (2, 3)), ("d", (4,))):
        await run.token(Token("r", text, ids[-1], None, logprobs_of(ids, 2)))
    relay.detach(mid_reply=True)
    (frame,) = relay.catch_up(1).frames
    assert frame == Token("r", "bcd", 4, None, logprobs_of((2, 3, 4), 2))
    kept = ReplyRecord.restore("r", run.record.export())
    assert kept.after("r", 1) == frame  # a store's copy catches up the same


def test_logprobs_with_fewer_alternatives_in_one_part_join_at_the_fewest() -> None:
    joined = TokenLogprobs.joined([logprobs_of((1,), 3), logprobs_of((2,), 1)])
    assert joined.top == 1
    assert joined.top_ids == (10, 20) and joined.top_logprobs == (-2.0, -3.0)
