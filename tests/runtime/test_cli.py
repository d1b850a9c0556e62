"""``wschat-server``'s options: the help text, ``WSCHAT_<NAME>`` for every option, usage errors."""

from __future__ import annotations

import argparse
import importlib.abc
import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from starlette.types import Receive, Scope, Send
from wschat.server.runtime.cli import HELP_HINT, build_parser, help_text, main, settings_from_args
from wschat.server.runtime.serve import uvicorn_config
from wschat.server.settings import Settings

from tests.runtime.readme_options import OPTIONS, README, readme_table, table


async def no_app(scope: Scope, receive: Receive, send: Send) -> None:
    """The ASGI app a configuration is built for here; it never runs."""


def option_help(name: str) -> str:
    """The help entry of ``--name`` (option line and text, whitespace collapsed)."""
    options = build_parser().format_help().split("options:", 1)[1]
    entry = re.search(rf"\n  {name}\b.*?(?=\n  -|\n\n)", options, re.DOTALL)
    assert entry, f"{name} not in the help"
    return " ".join(entry.group(0).split())


def env_actions() -> list[argparse.Action]:
    """The options that read ``WSCHAT_<DEST>`` (all but -h and the two list options)."""
    skip = {"help", "token", "allowed_origin", "allowed_host", "forwarded_allow_ips"}
    return [a for a in build_parser()._actions if a.option_strings and a.dest not in skip]


# Options whose values are checked by a parser of their own: a valid one other than the default.
VALID_SAMPLES = {
    "threads": "3",
    "max_concurrent": "4",
    "session_store": "redis://127.0.0.1:6379/0",
    "engine_images": "2",
    "device": "cpu",
    "port": "9000",
    "max_replays": "5",
    "max_image_checks": "3",
}


def value_other_than_default(action: argparse.Action) -> str:
    if action.dest in VALID_SAMPLES:
        return VALID_SAMPLES[action.dest]
    if action.choices:
        return str(next(c for c in action.choices if c != action.default))
    if action.type is int:
        return str(int(action.default) + 7)
    if action.type is float:
        return str(float(action.default) + 0.5)
    return f"from-env-{action.dest}"


def test_cache_dir_help_says_its_default_once() -> None:
    text = option_help("--cache-dir")
    assert text.count("default") == 1, text
    assert "$XDG_CACHE_HOME/wschat or ~/.cache/wschat" in text


def test_help_ends_with_the_wschat_variables_and_an_example() -> None:
    epilog = build_parser().format_help().split("options:", 1)[1]
    assert "WSCHAT_<NAME>" in epilog and "WSCHAT_TOKENS" in epilog
    example = "WSCHAT_PORT=9000 WSCHAT_MAX_CONCURRENT=4 wschat-server --log-level debug"
    assert f"\n  {example}\n" in epilog


def test_help_never_prints_the_tokens_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WSCHAT_TOKENS", "s3cret-token")
    assert "s3cret-token" not in build_parser().format_help()


def test_every_option_reads_its_wschat_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    actions = env_actions()
    lists = {"tokens", "allowed_origins", "allowed_hosts", "forwarded_allow_ips", "extra"}
    assert {a.dest for a in actions} == {f.name for f in fields(Settings)} - lists
    for action in actions:
        raw = value_other_than_default(action)
        monkeypatch.setenv(f"WSCHAT_{action.dest.upper()}", raw)
        value = getattr(settings_from_args([]), action.dest)
        convert = action.type
        assert callable(convert)
        assert (str(value) if isinstance(value, Path) else value) == convert(raw), action.dest
        monkeypatch.delenv(f"WSCHAT_{action.dest.upper()}")


def test_list_options_read_comma_separated_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WSCHAT_TOKENS", "a, b")
    monkeypatch.setenv("WSCHAT_ALLOWED_ORIGINS", "https://x.example")
    settings = settings_from_args([])
    assert settings.tokens == ("a", "b")
    assert settings.allowed_origins == ("https://x.example",)


def test_the_command_line_wins_over_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WSCHAT_PORT", "9000")
    assert settings_from_args(["--port", "9100"]).port == 9100


def test_log_level_ignores_case() -> None:
    assert settings_from_args(["--log-level", "DEBUG"]).log_level == "debug"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--log-level", "loud"], {}, "argument --log-level: invalid choice: 'loud'"),
        ([], {"WSCHAT_LOG_LEVEL": "loud"}, "WSCHAT_LOG_LEVEL: invalid choice 'loud'"),
        (
            [],
            {"WSCHAT_PORT": "eighty"},
            "argument --port: expected a port from 0 to 65535; got 'eighty'",
        ),
        (
            ["--max-replays", "0"],
            {},
            "argument --max-replays: expected a whole number, 1 or more; got '0'",
        ),
    ],
)
def test_a_bad_value_is_a_usage_error(
    argv: list[str],
    env: dict[str, str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_:
        settings_from_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    first, *rest = err.splitlines()
    assert first.startswith(f"wschat-server: error: {message}") and rest == [HELP_HINT]


def test_proxies_and_host_names_come_from_repeated_or_comma_separated_options() -> None:
    settings = settings_from_args(
        [
            "--forwarded-allow-ips",
            "10.0.0.1, 10.0.0.2",
            "--forwarded-allow-ips",
            "192.168.0.0/16",
            "--allowed-host",
            "chat.example",
            "--allowed-host",
            "other.example",
        ]
    )
    assert settings.forwarded_allow_ips == ("10.0.0.1", "10.0.0.2", "192.168.0.0/16")
    assert settings.allowed_hosts == ("chat.example", "other.example")
    config = uvicorn_config(settings, app=no_app)
    assert config.proxy_headers and config.forwarded_allow_ips == list(settings.forwarded_allow_ips)


def test_no_proxy_is_trusted_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")  # uvicorn's own variable changes nothing
    settings = settings_from_args([])
    assert settings.forwarded_allow_ips == () and settings.allowed_hosts == ()
    assert uvicorn_config(settings, app=no_app).proxy_headers is False


def test_the_environment_sets_proxies_and_host_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WSCHAT_FORWARDED_ALLOW_IPS", "10.0.0.1,10.0.0.2")
    monkeypatch.setenv("WSCHAT_ALLOWED_HOSTS", "chat.example")
    settings = settings_from_args([])
    assert settings.forwarded_allow_ips == ("10.0.0.1", "10.0.0.2")
    assert settings.allowed_hosts == ("chat.example",)


def test_an_unknown_engine_in_the_environment_is_refused_when_the_arguments_are_read(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WSCHAT_ENGINE", "bogus")
    with pytest.raises(SystemExit) as exited:
        settings_from_args([])
    assert exited.value.code == 2
    assert "WSCHAT_ENGINE: invalid choice 'bogus'" in capsys.readouterr().err


def test_session_store_takes_memory_or_a_redis_url_and_refuses_the_rest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert settings_from_args([]).session_store == "memory"
    url = "unix:///run/redis.sock"
    assert settings_from_args(["--session-store", url]).session_store == url
    with pytest.raises(SystemExit):
        settings_from_args(["--session-store", "http://secret@host"])
    assert "secret" not in capsys.readouterr().err  # only the scheme is echoed


class _NoXllamacpp(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object, target: object = None) -> None:
        if name.partition(".")[0] == "xllamacpp":
            raise ImportError("xllamacpp is not installed (hidden by the test)")


def test_engine_llamacpp_without_xllamacpp_says_what_to_install_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "meta_path", [_NoXllamacpp(), *sys.meta_path])
    assert main(["--engine", "llamacpp", "--port", "0"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        "wschat-server --engine llamacpp needs the gateway and llamacpp extras (missing: "
        'xllamacpp): pip install -e ".[gateway,llamacpp]" in the wschat checkout'
    ]


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The lines ``wschat-server ARGV`` prints on stderr as it exits 2 on a usage error."""
    with pytest.raises(SystemExit) as exited:
        settings_from_args(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err.splitlines()


def test_a_usage_error_is_one_line_and_a_pointer_to_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert usage_error(["--max-concurrent", "lots"], capsys) == [
        "wschat-server: error: argument --max-concurrent: expected 'auto' or a whole number of "
        "generations, 1 or more (from the flag or WSCHAT_MAX_CONCURRENT); got 'lots'",
        HELP_HINT,
    ]
    assert HELP_HINT == "Run 'wschat-server --help' for the options."


@pytest.mark.parametrize("source", ["flag", "env"])
def test_an_unknown_device_is_refused_with_the_choices_when_the_arguments_are_read(
    source: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--device", "gpu"] if source == "flag" else []
    if source == "env":
        monkeypatch.setenv("WSCHAT_DEVICE", "gpu")
    assert usage_error(argv, capsys)[0] == (
        "wschat-server: error: argument --device: invalid choice: 'gpu' "
        "(choose from auto, cpu, cuda, cuda:N)"
    )


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_the_devices_torch_names_are_accepted(device: str) -> None:
    assert settings_from_args(["--device", device]).device == device


def test_a_device_this_machine_lacks_is_refused_before_the_model_loads(
    tiny_text_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    missing = f"cuda:{torch.cuda.device_count()}"  # one past the last GPU, or none at all
    assert main(["--device", missing, "--model", str(tiny_text_dir), "--port", "0"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"wschat-server: --device {missing}: "), line
    assert "use --device cpu or auto" in line


@pytest.mark.parametrize("folder", ["/no/such/model", "./no-such-model", "~/no-such-model"])
def test_a_model_folder_that_does_not_exist_is_refused_when_the_arguments_are_read(
    folder: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert usage_error(["--model", folder], capsys)[0] == (
        f"wschat-server: error: --model {folder}: no model folder at {Path(folder).expanduser()}"
    )


def test_a_tokenizer_file_that_does_not_exist_is_refused_when_the_arguments_are_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--engine", "openai", "--tokenizer", "/no/such/tokenizer.json"]
    assert usage_error(argv, capsys)[0] == (
        "wschat-server: error: --tokenizer /no/such/tokenizer.json: no such file or folder"
    )


def test_a_default_reply_length_above_the_cap_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--max-new-tokens", "512", "--default-max-new-tokens", "1000"]
    assert usage_error(argv, capsys)[0] == (
        "wschat-server: error: --default-max-new-tokens 1000 is more than --max-new-tokens 512, "
        "the most a prompt may ask for"
    )


@pytest.mark.parametrize("port", ["-1", "65536"])
def test_a_port_out_of_range_is_refused(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert usage_error(["--port", port], capsys)[0] == (
        f"wschat-server: error: argument --port: expected a port from 0 to 65535; got '{port}'"
    )


HELP_GROUPS = (
    "model and engine",
    "replies",
    "sessions and limits",
    "network and security",
    "replicas and shutdown",
    "logging",
)


def test_help_groups_every_option_under_a_heading() -> None:
    parser = build_parser()
    groups = {g.title: g for g in parser._action_groups}
    assert set(HELP_GROUPS) <= set(groups)
    grouped = [a.dest for title in HELP_GROUPS for a in groups[title]._group_actions]
    every = [a.dest for a in parser._actions if a.dest != "help"]
    assert sorted(grouped) == sorted(every)  # each option in one group, none left out
    text = parser.format_help()
    headings = [text.index(f"\n{title}:\n") for title in HELP_GROUPS]
    assert headings == sorted(headings)


def test_help_says_which_reply_length_is_the_cap_and_which_is_used() -> None:
    cap, used = option_help("--max-new-tokens"), option_help("--default-max-new-tokens")
    assert "the cap" in cap and "--default-max-new-tokens" in cap
    assert "when a prompt names none" in used and "(default: 256)" in used


def test_the_readme_options_table_is_the_settings_own_descriptions() -> None:
    """Each setting is described once (server/settings.py); the README's table is written from
    it by ``python -m tests.runtime.readme_options --write``."""
    assert readme_table(README.read_text()) == table()
    flags = {a.option_strings[0] for a in build_parser()._actions if a.option_strings}
    assert {f"--{name.replace('_', '-')}" for name in OPTIONS} <= flags


def test_each_option_is_helped_by_its_settings_description() -> None:
    assert help_text("`auto` or `--threads` at 100%") == "'auto' or --threads at 100%%"
    helps = {a.help for a in build_parser()._actions if a.option_strings and a.dest != "help"}
    assert helps == {help_text(f.metadata["help"]) for f in fields(Settings)}


def test_the_progress_bars_of_transformers_and_its_gguf_reader_are_off() -> None:
    """Their carriage-return lines ran into the log lines of the first start's conversion."""
    code = (
        "from wschat.server.runtime.cli import quiet_progress_bars\n"
        "quiet_progress_bars()\n"
        "from transformers.modeling_gguf_pytorch_utils import tqdm\n"
        "from transformers.utils.logging import tqdm as hf_tqdm\n"
        "list(tqdm(range(3), desc='gguf')); list(hf_tqdm(range(3), desc='weights'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in PROGRESS_VARIABLES}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert (result.returncode, result.stderr) == (0, "")


PROGRESS_VARIABLES = ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")
