"""docker-compose.yml: every ``docker compose`` command that README.md, docs/deploy.md and the
file's own comments give starts services that exist, with their dependencies enabled, and no
two of them publish one host port; each engine has a healthcheck that its gateway waits on. Its
profile ``replicas``: HAProxy on deploy/haproxy.cfg in front of scaled gateway replicas that
keep their sessions in Redis with AOF on, and an engine for them.
Parsed, not run: these tests need no Docker daemon (tests/deploy/test_haproxy.py runs the same
HAProxy config with real processes)."""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections import Counter
from dataclasses import dataclass
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version
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


# where the commands a user runs are written
DOCUMENTS = [ROOT / "README.md", ROOT / "docs" / "deploy.md", ROOT / "docker-compose.yml"]


def documented_commands(path: Path) -> list[str]:
    """Every ``docker compose`` command in ``path``'s code spans (a span may wrap over lines;
    in the compose file, over its comment lines)."""
    text = path.read_text()
    if path.suffix == ".yml":
        text = "\n".join(line.split("#", 1)[1] for line in text.splitlines() if "#" in line)
    spans = (" ".join(span.split()) for span in re.findall(r"`([^`]+)`", text))
    return [span for span in spans if re.match(r"(\w+=\S+ )*docker compose ", span)]


COMMANDS = sorted({c for path in DOCUMENTS for c in documented_commands(path)})


@dataclass
class Up:
    """What ``docker compose [--profile P]... up [--scale S=N]... [SERVICE]...`` starts."""

    profiles: set[str]
    named: list[str]
    scale: dict[str, int]

    @classmethod
    def parse(cls, command: str) -> Up:
        words = shlex.split(command)
        while "=" in words[0]:  # VARIABLE=value before the command
            words.pop(0)
        assert words[:2] == ["docker", "compose"], command
        profiles, at = set(), 2
        while words[at] == "--profile":
            profiles.add(words[at + 1])
            at += 2
        assert words[at] == "up", command
        named, scale = [], {}
        rest = iter(words[at + 1 :])
        for word in rest:
            if word == "--scale":
                service, count = next(rest).split("=")
                scale[service] = int(count)
            elif word.startswith("--scale="):
                service, count = word.removeprefix("--scale=").split("=")
                scale[service] = int(count)
            elif word in ("-d", "--detach", "--build"):
                continue
            else:
                assert not word.startswith("-"), (word, command)
                named.append(word)
        return cls(profiles, named, scale)

    def enabled(self, name: str) -> bool:
        """Compose runs a service with no profile, or one of an active profile; naming a service
        activates its profiles, but not those of what it depends on."""
        service_profiles = set(SERVICES[name].get("profiles", []))
        return not service_profiles or bool(service_profiles & self.profiles) or name in self.named

    def active(self) -> set[str]:
        """The profiles the command runs: those it names, and those of the services it names."""
        return self.profiles.union(*(SERVICES[n].get("profiles", []) for n in self.named))

    def services(self) -> set[str]:
        """The services named (or, when none is, every enabled one) and what they depend on."""
        started: set[str] = set()
        waiting = list(self.named or (name for name in SERVICES if self.enabled(name)))
        while waiting:
            name = waiting.pop()
            assert name in SERVICES, name
            if name not in started:
                started.add(name)
                waiting += list(SERVICES[name].get("depends_on", []))
        return started

    def instances(self, name: str) -> int:
        return int(self.scale.get(name, SERVICES[name].get("deploy", {}).get("replicas", 1)))


def host_ports(service: dict[str, Any]) -> list[str]:
    """The host side of each published port (``[IP:]HOST:CONTAINER``)."""
    return [str(port).rsplit(":", 1)[0] for port in service.get("ports", [])]


def test_the_documents_give_a_command_for_every_profile() -> None:
    named = {p for c in COMMANDS for p in Up.parse(c).active()}
    profiles = {p for s in SERVICES.values() for p in s.get("profiles", [])}
    assert profiles <= named, profiles - named
    assert all(s.get("profiles") for s in SERVICES.values())  # a bare `up` starts nothing extra


@pytest.mark.parametrize("command", COMMANDS)
def test_a_documented_command_starts_services_that_share_no_host_port(command: str) -> None:
    up = Up.parse(command)
    started = up.services()
    assert started, command
    for name in started:  # a dependency in a profile left off: compose refuses the command
        assert up.enabled(name), (name, command)
    published = Counter(
        port for name in started for port in host_ports(SERVICES[name]) * up.instances(name)
    )
    assert [port for port, count in published.items() if count > 1] == [], (command, started)


@pytest.mark.parametrize("gateway", ["wschat-llamacpp", "wschat-vllm"])
def test_a_gateway_is_built_and_waits_for_its_engine_to_be_healthy(gateway: str) -> None:
    service = SERVICES[gateway]
    assert service["build"] == {"context": ".", "dockerfile": "Dockerfile.gateway"}
    (engine,) = service["depends_on"]
    assert service["depends_on"][engine] == {"condition": "service_healthy"}
    assert "healthcheck" in SERVICES[engine]


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


def test_vllm_is_pinned_to_a_release_that_attends_gemma_3s_images_both_ways() -> None:
    # before 0.13.0, vLLM attends Gemma 3's image tokens causally (its is_mm_prefix_lm came in
    # 0.13.0), and the profile serves images (--limit-mm-per-prompt)
    image, tag = SERVICES["vllm"]["image"].split(":")
    assert image == "vllm/vllm-openai" and re.fullmatch(r"v\d+\.\d+\.\d+", tag)
    assert Version(tag.removeprefix("v")) >= Version("0.13.0")
    assert any(flag.startswith("--limit-mm-per-prompt=") for flag in SERVICES["vllm"]["command"])
    # docs/deploy.md says which release its fields were checked against
    assert f"vLLM {tag.removeprefix('v')}" in (ROOT / "docs" / "deploy.md").read_text()
