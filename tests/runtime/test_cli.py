"""``wschat-server``'s options: the help text, ``WSCHAT_<NAME>`` for every option, usage errors."""

from __future__ import annotations

import argparse
import importlib.abc
import re
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from wschat.server.runtime.cli import build_parser, main, settings_from_args
from wschat.server.runtime.serve import uvicorn_config
from wschat.server.settings import Settings


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
}


def value_other_than_default(action: argparse.Action) -> str:
    if action.dest in VALID_SAMPLES:
        return VALID_SAMPLES[action.dest]
    if action.choices:
        return next(c for c in action.choices if c != action.default)
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
        ([], {"WSCHAT_PORT": "eighty"}, "argument --port: invalid int value: 'eighty'"),
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
    assert err.startswith("usage: wschat-server") and f"wschat-server: error: {message}" in err


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
    config = uvicorn_config(settings, app=None)
    assert config.proxy_headers and config.forwarded_allow_ips == list(settings.forwarded_allow_ips)


def test_no_proxy_is_trusted_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")  # uvicorn's own variable changes nothing
    settings = settings_from_args([])
    assert settings.forwarded_allow_ips == () and settings.allowed_hosts == ()
    assert uvicorn_config(settings, app=None).proxy_headers is False


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
