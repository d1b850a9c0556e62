"""The ``wschat`` command as a subprocess (``python -m wschat.client``) against a real uvicorn:
``ask``, its arguments and exit statuses, Ctrl-C, and the options ``chat`` shares
(``client/cli.py``)."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
from wschat.client.cli import build_parser
from wschat.client.status import STOPPING_NOTICE, ExitStatus
from wschat.server.engine import GenerationRequest

from tests.client.cli_process import W8, cli, cli_env, run_cli, scripts_in_turn
from tests.client.engines import failing_engine, is_sublist, slow_engine
from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import running_server

pytestmark = pytest.mark.usefixtures("own_state_folder")


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
