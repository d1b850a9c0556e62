"""``wschat-server``'s options (server/cli.py): values from flags and ``WSCHAT_*``, and the ones
refused when the arguments are read."""

from __future__ import annotations

import pytest
from wschat.server.cli import settings_from_args
from wschat.server.serve import uvicorn_config


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
    assert "WSCHAT_ENGINE: invalid choice: 'bogus'" in capsys.readouterr().err
