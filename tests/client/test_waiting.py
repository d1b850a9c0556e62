"""What ``wschat ask`` and ``wschat chat`` do and say while they wait for a server: one not
listening yet, one whose model is still loading, a full one, one whose model failed to load
(``client/waiting.py``)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from wschat.client import connect

from tests.client.cli_process import W8, cli, cli_env, run_cli
from tests.client.engines import WAIT
from tests.fakes.scripted import ScriptedEngine
from tests.proxy import cuttable_proxy
from tests.support import free_port, loading_server, running_server, wait_until

pytestmark = pytest.mark.usefixtures("own_state_folder")


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
