"""The ``wschat`` command as a subprocess (``python -m wschat.client``) against a real uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from wschat.client import connect
from wschat.client.cli import build_parser
from wschat.client.status import STOPPING_NOTICE, ExitStatus
from wschat.server.engine import GenerationRequest

from tests.client.engines import WAIT, failing_engine, is_sublist, slow_engine
from tests.fakes.scripted import Script, ScriptedEngine
from tests.proxy import cuttable_proxy
from tests.support import free_port, loading_server, running_server, wait_until

ROOT = Path(__file__).resolve().parents[2]
FAST = Script([" hi", " there"])
W8 = "".join(f" w{i}" for i in range(8))  # the default scripted reply, ended on its own
WAITING = "waiting for the model to load (up to {} s)...\n"
NOT_LISTENING = (
    "cannot connect to {}: nothing is listening there; waiting for the server (up to {} s)...\n"
)
NEVER_ANSWERED = (
    "cannot connect to {0}: nothing is listening there, and no server has answered at "
    "127.0.0.1:{1} before (is the port right?); waiting up to {2} s for one to start there "
    "(--wait SECONDS to shorten, --wait 0 not to wait)...\n"
)
STILL_WAITING = "still waiting for {}: {} ({} s of {})\n"
STILL_LOADING = "the server closed the connection (code 1013): the model is still loading"
WAIT_HINT = " (wait for it with --wait SECONDS)"


@pytest.fixture(autouse=True)
def own_state_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's CLI remembers the servers that answered (client/waiting.py) in a folder of
    its own: one test's server never counts as having answered for another's."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WSCHAT_")}
    return {**env, "HF_HUB_OFFLINE": "1", **extra}


async def start_cli(*args: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "wschat.client",
        *args,
        cwd=ROOT,
        env=env or cli_env(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


@contextlib.asynccontextmanager
async def cli(*args: str, env: dict[str, str] | None = None) -> AsyncIterator[CliProcess]:
    process = await start_cli(*args, env=env)
    try:
        yield CliProcess(process)
    finally:
        if process.returncode is None:
            process.kill()
        async with asyncio.timeout(WAIT):
            await process.wait()


async def run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    async with cli(*args, env=env) as process:
        async with asyncio.timeout(WAIT):
            out, err = await process.process.communicate()
        assert process.process.returncode is not None
        return process.process.returncode, out.decode(), err.decode()


class CliProcess:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.output = ""  # stdout not yet matched by ``read_until``

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        async with asyncio.timeout(WAIT):
            await self.process.stdin.drain()

    async def read_until(self, needle: str) -> str:
        """Stdout up to and including ``needle``."""
        assert self.process.stdout is not None
        async with asyncio.timeout(WAIT):
            while needle not in self.output:
                chunk = await self.process.stdout.read(4096)
                assert chunk, f"stdout ended before {needle!r}; got {self.output!r}"
                self.output += chunk.decode()
        head, _, self.output = self.output.partition(needle)
        return head + needle

    async def stderr_line(self) -> str:
        assert self.process.stderr is not None
        async with asyncio.timeout(WAIT):
            return (await self.process.stderr.readline()).decode()

    async def exit_status(self) -> int:
        async with asyncio.timeout(WAIT):
            return await self.process.wait()

    async def stderr(self) -> str:
        assert self.process.stderr is not None
        async with asyncio.timeout(WAIT):
            return (await self.process.stderr.read()).decode()


def scripts_in_turn(*scripts: Script) -> ScriptedEngine:
    """An engine whose n-th generation follows the n-th script."""
    pending: Iterator[Script] = iter(scripts)
    return ScriptedEngine(lambda request: next(pending))


def slow(n: int = 400) -> Script:
    return Script([f" s{i}" for i in range(n)], delay_s=0.05, end_with_eos=False)


# -- wschat ask ----------------------------------------------------------------------------


async def test_ask_prints_the_streamed_reply_and_exits_0() -> None:
    async with running_server(ScriptedEngine()) as url:
        status, out, err = await run_cli("ask", "--url", url, "hello")
    assert (status, out) == (0, "".join(f" w{i}" for i in range(8)) + "\n"), err


async def test_ask_passes_max_new_tokens_and_system_to_the_server() -> None:
    engine = ScriptedEngine()
    async with running_server(engine) as url:
        status, out, err = await run_cli(
            "ask", "--url", url, "--max-new-tokens", "3", "--system", "Be terse.", "hi"
        )
    assert (status, out) == (6, " w0 w1 w2\n"), err  # 6: cut at the limit it was given
    request: GenerationRequest = engine.requests[-1]
    assert request.params.max_new_tokens == 3
    assert is_sublist(engine.tokenize_text("Be terse."), request.prompt_ids)


async def test_ask_takes_the_url_from_wschat_url() -> None:
    async with running_server(ScriptedEngine()) as url:
        env = cli_env(WSCHAT_URL=url)
        status, out, _ = await run_cli("ask", "hi", env=env)
    assert (status, out) == (0, W8 + "\n")


async def test_ask_with_stats_prints_time_to_first_token_and_rate_to_stderr() -> None:
    async with running_server(ScriptedEngine()) as url:
        status, _, err = await run_cli("ask", "--url", url, "--stats", "hello")
    assert status == 0
    assert re.fullmatch(
        r"ttft_ms=\d+\.\d tokens_per_s=\d+\.\d prompt_tokens=\d+ completion_tokens=8 "
        r"cached_tokens=0 total_ms=\d+\.\d\n",
        err,
    ), err


async def test_ask_whose_generation_fails_exits_5_with_the_error_on_stderr() -> None:
    async with running_server(failing_engine(after=2)) as url:
        status, out, err = await run_cli("ask", "--url", url, "hello")
    assert (status, out, err) == (5, " a b\n", "error: internal: generation failed\n")


async def test_ask_refused_by_the_server_exits_4(tmp_path: Path) -> None:
    image = tmp_path / "pixel.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 16)
    async with running_server(ScriptedEngine()) as url:
        status, out, err = await run_cli("ask", "--url", url, "--image", str(image), "what?")
    assert (status, out) == (4, "")
    assert err == "error: unsupported: the model 'scripted' does not read images\n"


async def test_ask_with_bad_params_exits_4_before_connecting() -> None:
    status, out, err = await run_cli(
        "ask", "--url", "ws://127.0.0.1:1/v1/chat", "--temperature", "9", "x"
    )
    assert (status, out, err) == (4, "", "error: invalid_params: temperature must be in [0, 2]\n")


async def test_ask_told_not_to_wait_with_nothing_listening_exits_3_at_once() -> None:
    url = f"ws://127.0.0.1:{free_port()}/v1/chat"
    status, out, err = await run_cli("ask", "--url", url, "--wait", "0", "hello")
    refused = f"cannot connect to {url}: nothing is listening there"
    assert (status, out, err) == (3, "", f"error: connect: {refused}{WAIT_HINT}\n")


async def test_ask_waits_for_a_server_not_listening_yet_then_prints_the_reply() -> None:
    port = free_port()
    url = f"ws://127.0.0.1:{port}/v1/chat"
    async with cli("ask", "--url", url, "--wait", "30", "hello") as ask:
        assert await ask.stderr_line() == NEVER_ANSWERED.format(url, port, 30)
        async with running_server(ScriptedEngine(), port=port):  # starts while it waits
            assert await ask.read_until("\n") == W8 + "\n"
            assert await ask.exit_status() == 0
        assert await ask.stderr() == ""  # the waiting line came once


async def test_ask_gives_up_on_a_server_not_listening_after_wait_and_exits_3() -> None:
    port = free_port()
    url = f"ws://127.0.0.1:{port}/v1/chat"
    status, out, err = await run_cli("ask", "--url", url, "--wait", "1", "hello")
    gave_up = f"cannot connect to {url}: nothing is listening there, still after waiting 1 s"
    assert (status, out) == (3, "")
    assert err == NEVER_ANSWERED.format(url, port, 1) + f"error: connect: {gave_up}{WAIT_HINT}\n"


@pytest.mark.parametrize("command", ["ask", "chat"])
async def test_a_wait_where_no_server_ever_answered_says_so_then_how_long_it_has_waited(
    command: str,
) -> None:
    port = free_port()
    url = f"ws://127.0.0.1:{port}/v1/chat"
    question = ["hello"] if command == "ask" else []
    env = cli_env(WSCHAT_WAIT_NOTICE_S="1")
    status, out, err = await run_cli(command, "--url", url, "--wait", "2.5", *question, env=env)
    gave_up = f"cannot connect to {url}: nothing is listening there, still after waiting 2.5 s"
    assert (status, out) == (3, "")
    assert err == (
        NEVER_ANSWERED.format(url, port, 2.5)
        + STILL_WAITING.format(url, "nothing listening", 1, 2.5)
        + STILL_WAITING.format(url, "nothing listening", 2, 2.5)
        + f"error: connect: {gave_up}{WAIT_HINT}\n"
    )


async def test_a_wait_where_a_server_answered_before_says_it_waits_for_the_server() -> None:
    port = free_port()
    async with running_server(ScriptedEngine(), port=port) as url:
        assert (await run_cli("ask", "--url", url, "hello"))[0] == 0
    env = cli_env(WSCHAT_WAIT_NOTICE_S="1")
    status, _, err = await run_cli("ask", "--url", url, "--wait", "1.5", "hello", env=env)
    gave_up = f"cannot connect to {url}: nothing is listening there, still after waiting 1.5 s"
    assert status == 3
    assert err == (
        NOT_LISTENING.format(url, 1.5)
        + STILL_WAITING.format(url, "nothing listening", 1, 1.5)
        + f"error: connect: {gave_up}{WAIT_HINT}\n"
    )


async def test_a_wait_for_a_loading_model_says_every_interval_that_it_still_loads() -> None:
    async with loading_server(ScriptedEngine()) as (url, load):
        env = cli_env(WSCHAT_WAIT_NOTICE_S="0.5")
        async with cli("ask", "--url", url, "--wait", "30", "hello", env=env) as ask:
            assert await ask.stderr_line() == WAITING.format(30)
            loading = STILL_WAITING.format(url, "the model is loading", 0.5, 30)
            assert await ask.stderr_line() == loading
            load.release()
            assert await ask.read_until("\n") == W8 + "\n"
            assert await ask.exit_status() == 0


@pytest.mark.parametrize("path", ["", "/chat"])
async def test_ask_at_a_url_without_the_chat_path_says_where_the_endpoint_is(path: str) -> None:
    async with running_server(ScriptedEngine()) as url:
        base = url.removesuffix("/v1/chat")
        status, out, err = await run_cli("ask", "--url", base + path, "hello")
    hint = f" (try {url})" if not path else ""
    no_chat = f"no chat endpoint at {base + path}; the chat endpoint is /v1/chat{hint}"
    assert (status, out, err) == (3, "", f"error: connect: {no_chat}\n")


async def test_ask_with_an_unreadable_image_or_bad_arguments_exits_2(tmp_path: Path) -> None:
    missing = tmp_path / "missing.png"
    status, _, err = await run_cli("ask", "--image", str(missing), "what?")
    assert status == 2
    assert err == f"error: usage: cannot read image {missing}: No such file or directory\n"
    status, _, err = await run_cli("ask", "--max-new-tokens", "many", "x")
    assert status == 2 and "invalid int value: 'many'" in err
    status, _, err = await run_cli("ask", "--wait", "-1", "x")
    assert status == 2 and "invalid seconds value: '-1'" in err
    status, _, err = await run_cli("ask", "x", env=cli_env(WSCHAT_WAIT_NOTICE_S="often"))
    assert status == 2
    assert err.endswith("WSCHAT_WAIT_NOTICE_S must be a number of seconds, not 'often'\n")


async def test_ask_interrupted_mid_reply_stops_it_and_exits_130() -> None:
    async with (
        running_server(slow_engine(delay_s=0.05)) as url,
        cli("ask", "--url", url, "go") as ask,
    ):
        first = await ask.read_until(" s0")
        ask.process.send_signal(signal.SIGINT)
        assert await ask.exit_status() == 130
        assert first == " s0" and "[stopped]" in await ask.stderr()


@pytest.mark.parametrize(("command", "status"), [("ask", 130), ("chat", 0)])
async def test_second_ctrl_c_leaves_when_the_reply_does_not_stop(command: str, status: int) -> None:
    engine = scripts_in_turn(Script([" a", " b"], stall_after=1))  # stops reading its cancel flag
    async with running_server(engine) as url:
        args = ("ask", "--url", url, "go") if command == "ask" else ("chat", "--url", url)
        async with cli(*args) as process:
            if command == "chat":
                await process.send("go")
            await process.read_until(" a")
            process.process.send_signal(signal.SIGINT)
            if command == "chat":
                assert (await process.stderr_line()).startswith("connected to scripted")
            assert await process.stderr_line() == STOPPING_NOTICE + "\n"
            process.process.send_signal(signal.SIGINT)  # the stop never comes: leave anyway
            assert await process.exit_status() == status
            assert process.process.stdout is not None
            assert " b" not in process.output + (await process.process.stdout.read()).decode()
        engine.unstall()


async def test_ask_cut_at_the_token_limit_prints_the_reply_then_a_notice_and_exits_6() -> None:
    async with running_server(ScriptedEngine()) as url:
        status, out, err = await run_cli("ask", "--url", url, "--max-new-tokens", "3", "hi")
    notice = "[reply cut at the 3-token limit: ask for up to 1024 with --max-new-tokens]\n"
    assert (status, out, err) == (6, " w0 w1 w2\n", notice)


# -- a server still loading its model, a full server ------------------------------------------


async def test_ask_waits_for_a_loading_model_saying_so_once_then_prints_the_reply() -> None:
    async with loading_server(ScriptedEngine()) as (url, load):
        port = urlsplit(url).port
        assert port is not None
        async with cuttable_proxy(port) as proxy:
            proxied = f"ws://127.0.0.1:{proxy.port}/v1/chat"
            async with cli("ask", "--url", proxied, "--wait", "30", "hello") as ask:
                assert await ask.stderr_line() == WAITING.format(30)
                await wait_until(lambda: proxy.accepted >= 3)  # refused twice or more
                load.release()
                assert await ask.read_until("\n") == W8 + "\n"
                assert await ask.exit_status() == 0
                assert await ask.stderr() == ""  # the waiting line came once


@pytest.mark.parametrize("how", ["--wait 0", "WSCHAT_WAIT=0"])
async def test_ask_told_not_to_wait_for_a_loading_model_exits_3_at_once(how: str) -> None:
    async with loading_server(ScriptedEngine()) as (url, _):
        if how == "--wait 0":
            result = await run_cli("ask", "--url", url, "--wait", "0", "hello")
        else:
            result = await run_cli("ask", "--url", url, "hello", env=cli_env(WSCHAT_WAIT="0"))
    assert result == (3, "", f"error: connect: {STILL_LOADING}{WAIT_HINT}\n")


async def test_ask_gives_up_on_a_model_still_loading_after_wait_and_exits_3() -> None:
    async with loading_server(ScriptedEngine()) as (url, _):
        status, out, err = await run_cli("ask", "--url", url, "--wait", "1", "hello")
    gave_up = f"error: connect: the model was still loading after waiting 1 s{WAIT_HINT}\n"
    assert (status, out, err) == (3, "", WAITING.format(1) + gave_up)


async def test_ask_on_a_full_server_exits_3_at_once_without_waiting() -> None:
    async with (
        running_server(ScriptedEngine(), max_connections=1) as url,
        connect(url, timeout=WAIT),  # takes the one place
    ):
        status, out, err = await run_cli("ask", "--url", url, "--wait", "30", "hello")
    full = "the server closed the connection (code 1013): the server is full (1 connections)"
    assert (status, out, err) == (3, "", f"error: connect: {full}\n")


async def test_ask_on_a_model_that_failed_to_load_exits_3_without_waiting_it_out() -> None:
    def fail_to_load() -> ScriptedEngine:
        raise RuntimeError("no weights here")

    async with running_server(fail_to_load) as url:
        status, out, err = await run_cli("ask", "--url", url, "--wait", "30", "hello")
    failed = "the server closed the connection (code 1011): the model failed to load"
    assert (status, out) == (3, "")
    assert err.endswith(f"error: connect: {failed} (see the server's log)\n"), err


async def test_chat_waits_for_a_loading_model_then_chats() -> None:
    async with (
        loading_server(ScriptedEngine()) as (url, load),
        cli("chat", "--url", url, "--wait", "30") as chat,
    ):
        assert await chat.stderr_line() == WAITING.format(30)
        load.release()
        assert (
            await chat.stderr_line()
            == f"connected to scripted at {url}; /help lists the commands\n"
        )
        await chat.send("hello")
        assert await chat.read_until("\n") == W8 + "\n"
        await chat.send("/quit")
        assert await chat.exit_status() == 0


# -- wschat chat ---------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["--url URL", "URL", "WSCHAT_URL"])
async def test_chat_takes_the_url_as_an_option_as_an_argument_or_from_wschat_url(
    spelling: str,
) -> None:
    async with running_server(ScriptedEngine()) as url:
        args = {"--url URL": ["--url", url], "URL": [url], "WSCHAT_URL": []}[spelling]
        env = cli_env(WSCHAT_URL=url if spelling == "WSCHAT_URL" else "ws://127.0.0.1:1/v1/chat")
        async with cli("chat", *args, env=env) as chat:
            connected = await chat.stderr_line()
            assert chat.process.stdin is not None
            chat.process.stdin.close()
            assert await chat.exit_status() == 0
    assert connected == f"connected to scripted at {url}; /help lists the commands\n"


@pytest.mark.parametrize("command", ["ask", "chat"])
def test_help_of_ask_and_chat_names_url_wait_and_every_exit_status(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([command, "--help"])
    text = capsys.readouterr().out
    assert exited.value.code == 0
    for option in ("--url URL", "WSCHAT_URL", "--wait SECONDS", "WSCHAT_WAIT, default 600"):
        assert option in " ".join(text.split()), option
    assert [line.split()[0] for line in text.split("exit statuses:\n")[1].splitlines()] == [
        str(status.value) for status in ExitStatus
    ]
    assert "[URL]" not in text  # ``wschat chat URL`` still works but is not advertised


async def test_chat_given_the_url_twice_is_a_usage_error() -> None:
    status, out, err = await run_cli("chat", "ws://a.test/v1/chat", "--url", "ws://b.test/v1/chat")
    assert (status, out) == (2, "")
    assert err.endswith("error: give the server URL once, as --url URL\n")


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


# -- wschat chat ---------------------------------------------------------------------------


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


async def test_chat_told_not_to_wait_with_nothing_listening_exits_3() -> None:
    status, _, err = await run_cli("chat", "--url", "ws://127.0.0.1:1/v1/chat", "--wait", "0")
    assert status == 3 and err.startswith("error: connect: cannot connect")


async def test_chat_waits_for_a_server_not_listening_yet_then_chats() -> None:
    port = free_port()
    url = f"ws://127.0.0.1:{port}/v1/chat"
    async with cli("chat", "--url", url, "--wait", "30") as chat:
        assert await chat.stderr_line() == NEVER_ANSWERED.format(url, port, 30)
        async with running_server(ScriptedEngine(), port=port):
            assert (
                await chat.stderr_line()
                == f"connected to scripted at {url}; /help lists the commands\n"
            )
            await chat.send("/quit")
            assert await chat.exit_status() == 0


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
