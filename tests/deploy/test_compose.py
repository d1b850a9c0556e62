"""docker-compose.yml's profile ``replicas``: HAProxy on deploy/haproxy.cfg in front of scaled
gateway replicas that keep their sessions in Redis with AOF on, and an engine for them.
Parsed, not run: these tests need no Docker daemon (tests/deploy/test_haproxy.py runs the same
HAProxy config with real processes)."""

from __future__ import annotations

import dataclasses
import re
from ipaddress import ip_address, ip_network
from typing import Any

from wschat.server.runtime.shutdown import CLOSE_S
from wschat.server.settings import Settings

from tests.deploy.cluster import CONFIG
from tests.install.test_docker import COMPOSE, SERVICES
from tests.support import ROOT

PROFILE = {name for name, s in SERVICES.items() if "replicas" in s.get("profiles", [])}
SETTINGS = {f.name for f in dataclasses.fields(Settings)}


def config_default(variable: str) -> str:
    """The default deploy/haproxy.cfg gives ``"${VARIABLE-default}"``."""
    (default,) = re.findall(rf'"\${{{variable}-([^}}]*)}}"', CONFIG.read_text())
    return str(default)


def compose_default(value: str) -> str:
    """``${NAME:-default}`` as compose reads it where NAME is not set."""
    match = re.fullmatch(r"\$\{\w+:-(.*)\}", value)
    return match.group(1) if match else value


def test_the_replicas_profile_has_haproxy_gateways_redis_and_an_engine() -> None:
    assert sorted(PROFILE) == ["haproxy", "llamacpp", "redis", "wschat-replica"]
    url = compose_default(SERVICES["wschat-replica"]["environment"]["WSCHAT_ENGINE_URL"])
    assert url.startswith("http://llamacpp:8080/")  # the engine of the same profile


def test_haproxy_runs_the_deploy_config_and_is_the_one_published_port() -> None:
    haproxy = SERVICES["haproxy"]
    assert haproxy["image"].startswith("haproxy:2.6")
    source, target, mode = haproxy["volumes"][0].split(":")
    assert (ROOT / source).resolve() == CONFIG and mode == "ro"
    assert target == "/usr/local/etc/haproxy/haproxy.cfg"  # where the image reads it
    listen_port = config_default("WSCHAT_LISTEN").rsplit(":", 1)[1]
    assert haproxy["ports"] == [f"8000:{listen_port}"]
    assert [n for n in PROFILE if SERVICES[n].get("ports")] == ["haproxy"]


def test_haproxy_finds_every_replica_through_dockers_dns() -> None:
    name, port = config_default("WSCHAT_REPLICAS").split(":")
    assert name == "wschat-replica" and port == "8000"  # the service, on the gateway's port
    assert config_default("WSCHAT_DNS") == "127.0.0.11:53"  # Docker's embedded DNS
    low, high = map(int, config_default("WSCHAT_REPLICA_SLOTS").split("-"))
    assert high - low + 1 >= SERVICES["wschat-replica"]["deploy"]["replicas"] >= 2


def test_the_replicas_share_their_sessions_in_redis_with_aof_on() -> None:
    replica: dict[str, Any] = SERVICES["wschat-replica"]
    assert replica["environment"]["WSCHAT_SESSION_STORE"].startswith("redis://redis:6379/")
    redis = SERVICES["redis"]
    command = " ".join(redis["command"])
    assert "--appendonly yes" in command and "--maxmemory-policy volatile-ttl" in command
    assert redis["volumes"] == ["redis-data:/data"]  # the AOF outlives the container
    assert replica["depends_on"]["redis"]["condition"] == "service_healthy"


def test_every_replica_setting_is_a_server_setting_and_a_drain_fits_its_stop_period() -> None:
    replica: dict[str, Any] = SERVICES["wschat-replica"]
    for variable in replica["environment"]:
        assert variable.removeprefix("WSCHAT_").lower() in SETTINGS, variable
    # the /readyz check tests/install/test_docker.py runs against a real server
    assert replica["healthcheck"] == SERVICES["wschat"]["healthcheck"]
    stop_s = int(replica["stop_grace_period"].removesuffix("s"))
    assert stop_s >= Settings().shutdown_grace_s + CLOSE_S  # the drain, then the closes


def test_the_replicas_trust_the_client_address_from_haproxy_alone() -> None:
    trusted = SERVICES["wschat-replica"]["environment"]["WSCHAT_FORWARDED_ALLOW_IPS"]
    assert trusted == SERVICES["haproxy"]["networks"]["default"]["ipv4_address"]
    (pool,) = COMPOSE["networks"]["default"]["ipam"]["config"]
    assert ip_address(trusted) in ip_network(pool["subnet"])
    # never handed out to another container of the project
    assert ip_address(trusted) not in ip_network(pool["ip_range"])
