"""``wschat chat`` as a subprocess against a real uvicorn: replies streamed, Ctrl-C, its commands,
retry, edit, back and history (``client/repl.py``)."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from tests.client.cli_process import cli, scripts_in_turn
from tests.client.engines import is_sublist
from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import running_server

pytestmark = pytest.mark.usefixtures("own_state_folder")


FAST = Script([" hi", " there"])


def slow(n: int = 400) -> Script:
    return Script([f" s{i}" for i in range(n)], delay_s=0.05, end_with_eos=False)


async def test_chat_notes_a_reply_cut_at_the_limit_and_goes_on() -> None:
    notice = "[reply cut at the 2-token limit: ask for up to 1024 with --max-new-tokens]\n"
    async with (
        running_server(ScriptedEngine()) as url,
        cli("chat", "--url", url, "--max-new-tokens", "2") as chat,
    ):
        assert (await chat.stderr_line()).startswith("connected to scripted")
        for text in ("hello", "again"):
            await chat.send(text)
            assert await chat.read_until("\n") == " w0 w1\n"
            assert await chat.stderr_line() == notice
        await chat.send("/quit")
        assert await chat.exit_status() == 0


async def test_chat_streams_replies_resets_and_ctrl_c_stops_a_reply_then_quits() -> None:
    engine = scripts_in_turn(FAST, slow(), FAST)
    async with running_server(engine) as url, cli("chat", "--url", url) as chat:
        await chat.send("hello")
        assert await chat.read_until("\n") == " hi there\n"
        await chat.send("/reset")
        assert await chat.read_until("\n") == "[reset]\n"
        await chat.send("tell me slowly")
        await chat.read_until(" s0")
        chat.process.send_signal(signal.SIGINT)  # mid-reply: stops it
        stopped = await chat.read_until("[stopped]\n")
        assert re.fullmatch(r"( s\d+)*\n\[stopped\]\n", stopped), stopped
        await chat.send("again")
        assert await chat.read_until("\n") == " hi there\n"
        chat.process.send_signal(signal.SIGINT)  # at the prompt: quits
        assert await chat.exit_status() == 0
        assert 1000 not in engine.requests[1].prompt_ids  # reset: no earlier reply in it
        assert 1000 in engine.requests[2].prompt_ids  # the stopped reply stays in the talk


async def test_chat_commands_and_end_of_input() -> None:
    engine = ScriptedEngine()
    async with running_server(engine) as url, cli("chat", "--url", url) as chat:
        await chat.send("/help")
        assert "/image PATH" in await chat.read_until("/quit")
        await chat.send("/system Be terse.")
        await chat.read_until("[system prompt set]\n")
        await chat.send("/nope")
        await chat.send("//slash")
        await chat.read_until(" w7\n")
        assert chat.process.stdin is not None
        chat.process.stdin.close()
        assert await chat.exit_status() == 0
        assert "unknown command /nope; /help lists them" in await chat.stderr()
    (request,) = engine.requests  # /nope sent nothing
    assert is_sublist(engine.tokenize_text("Be terse."), request.prompt_ids)
    assert is_sublist(engine.tokenize_text("/slash"), request.prompt_ids)
    assert not is_sublist(engine.tokenize_text("//slash"), request.prompt_ids)


async def test_chat_image_command_on_a_text_only_model_reports_unsupported(tmp_path: Path) -> None:
    image = tmp_path / "pixel.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 16)
    async with running_server(ScriptedEngine()) as url, cli("chat", "--url", url) as chat:
        await chat.send(f"/image {image}")
        await chat.send("/quit")
        assert await chat.exit_status() == 0
        err = await chat.stderr()
    assert "error: unsupported: the model 'scripted' does not read images" in err


async def test_chat_retry_edit_back_and_history_keep_the_transcript_true() -> None:
    engine = scripts_in_turn(*(Script([f" r{n}"]) for n in range(1, 7)))
    async with running_server(engine) as url, cli("chat", "--url", url) as chat:
        await chat.send("/help")
        shown = await chat.read_until("beginning with /.\n")
        for command in ("/retry [TEMP]", "/edit TEXT", "/edit N TEXT", "/back [N]", "/history"):
            assert command in shown, command
        for line, expected in [
            ("one", " r1\n"),
            ("two", " r2\n"),
            ("/retry", "[a new reply to message 2]\n r3\n"),
            ("/edit 1 uno", "[message 1 replaced; message 2 and its reply dropped]\n r4\n"),
            ("three", " r5\n"),
            ("/history", "  1  uno\n  2  three\n"),
            ("/back", "[message 2 and its reply dropped; 1 left]\n"),
            ("/edit eins", "[message 1 replaced]\n r6\n"),
            ("/history", "  1  eins\n"),
        ]:
            await chat.send(line)
            assert await chat.read_until(expected.splitlines()[-1] + "\n") == expected, line
        await chat.send("/quit")
        assert await chat.exit_status() == 0
    assert engine.requests[2].prompt_ids == engine.requests[1].prompt_ids  # /retry: "two" again
    last = engine.requests[-1].prompt_ids
    assert is_sublist(engine.tokenize_text("eins"), last)
    for gone in ("one", "uno", "three"):
        assert not is_sublist(engine.tokenize_text(gone), last), gone
    first, one = engine.requests[0].prompt_ids, engine.tokenize_text("one")
    at = next(i for i in range(len(first)) if first[i : i + len(one)] == one)
    assert last == [*first[:at], *engine.tokenize_text("eins"), *first[at + len(one) :]]


async def test_chat_retry_edit_and_back_that_cannot_be_done_say_why_and_change_nothing() -> None:
    engine = scripts_in_turn(Script([" r1"]), Script([" x"], fail_after=0), Script([" r2"]))
    async with running_server(engine) as url, cli("chat", "--url", url) as chat:
        assert (await chat.stderr_line()).startswith("connected to scripted")
        for line in ("/retry", "/edit nothing yet"):
            await chat.send(line)
            assert (await chat.stderr_line()).startswith("error: invalid_params: "), line
        await chat.send("one")
        assert await chat.read_until("\n") == " r1\n"
        await chat.send("/retry 9")
        assert await chat.stderr_line() == "error: invalid_params: temperature must be in [0, 2]\n"
        await chat.send("/retry")  # its reply fails: the earlier one stays
        assert await chat.read_until("stays]\n") == (
            "[a new reply to message 1]\n[the earlier reply to message 1 stays]\n"
        )
        assert await chat.stderr_line() == "error: internal: generation failed\n"
        await chat.send("/back 2")
        assert await chat.stderr_line() == "error: usage: /back 2: the conversation holds 1\n"
        await chat.send("/edit 3 more")
        assert await chat.stderr_line() == (
            "error: invalid_params: there is no message 3 to edit; the conversation holds 1\n"
        )
        await chat.send("/history")
        assert await chat.read_until("\n") == "  1  one\n"
        await chat.send("two")
        assert await chat.read_until("\n") == " r2\n"
        await chat.send("/quit")
        assert await chat.exit_status() == 0
    assert is_sublist(engine.tokenize_text("one"), engine.requests[-1].prompt_ids)
