"""The generation contract a session's frame log keeps, whatever frames it was sent: at most one
generation open at a time, at most one ``start`` and one ``done`` per id, no frame of a
generation after its ``done``, ``concat(tokens) == done.text`` and the text its script implies
(tests/sessions/test_session_state_machine.py checks it after every step)."""

from __future__ import annotations

from wschat.protocol import Done, Error, ErrorCode, FinishReason, Frame, Queued, Start, Token

from tests.fakes.scripted import Script


def natural_end(script: Script) -> tuple[FinishReason, str]:
    """The reason and text a script's generation ends with when nobody cancels it."""
    if script.fail_after is not None and script.fail_after < len(script.tokens):
        return FinishReason.ERROR, "".join(script.tokens[: script.fail_after])
    return (FinishReason.STOP if script.end_with_eos else FinishReason.LENGTH), "".join(
        script.tokens
    )


def check_log(
    frames: list[Frame], scripts: list[Script], cancelled: set[str], *, final: bool
) -> None:
    open_id: str | None = None
    starts: list[str] = []
    done: set[str] = set()
    texts: dict[str, list[str]] = {}
    last_index: dict[str, int] = {}
    failed: set[str] = set()
    for frame in frames:
        if isinstance(frame, Error):
            assert isinstance(frame.code, ErrorCode) and frame.message
            if frame.code is ErrorCode.INTERNAL:
                # only a failing generation is internal here
                assert frame.id is not None and frame.id == open_id
                failed.add(frame.id)
            continue
        gen_id: str = getattr(frame, "id", "")
        if isinstance(frame, Queued | Start | Token | Done):
            assert gen_id not in done, f"{type(frame).__name__} after done for {gen_id}"
            assert open_id in (None, gen_id), f"{gen_id} while {open_id} is open"
        if isinstance(frame, Queued):
            assert frame.position >= 1 and gen_id not in starts
            open_id = gen_id
        elif isinstance(frame, Start):
            assert gen_id not in starts
            starts.append(gen_id)
            open_id = gen_id
        elif isinstance(frame, Token):
            assert gen_id in starts and frame.text
            assert frame.index > last_index.get(gen_id, 0)
            last_index[gen_id] = frame.index
            texts.setdefault(gen_id, []).append(frame.text)
        elif isinstance(frame, Done):
            assert open_id == gen_id
            check_done(frame, texts.get(gen_id, []), starts, scripts, cancelled, failed)
            done.add(gen_id)
            open_id = None
    if final:
        assert open_id is None and set(starts) <= done


def check_done(
    done: Done,
    texts: list[str],
    starts: list[str],
    scripts: list[Script],
    cancelled: set[str],
    failed: set[str],
) -> None:
    assert "".join(texts) == done.text
    assert (done.timing.ttft_ms is None) == (not texts)
    assert (done.reason is FinishReason.ERROR) == (done.id in failed)
    if done.id not in starts:  # cancelled while queued
        assert done.id in cancelled and done.reason is FinishReason.CANCELLED and done.text == ""
        return
    reason, text = natural_end(scripts[starts.index(done.id)])
    if done.reason is FinishReason.CANCELLED:
        assert done.id in cancelled and text.startswith(done.text)
    else:
        assert (done.reason, done.text) == (reason, text)
