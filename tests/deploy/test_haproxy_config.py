"""deploy/haproxy.cfg and deploy/haproxy-local.cfg as written: HAProxy 2.6 accepts them, what
they log of a request leaves the query string (the resume token, a bearer token) out, the local
one routes by the same lines as the compose one, and one address at its handshake bound cannot
fill the session table within the entries' expiry."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.deploy.cluster import CONFIG, HAPROXY, LOCAL_CONFIG
from tests.deploy.test_compose import config_default
from tests.support import TIMEOUT

CONFIGS = pytest.mark.parametrize("config", [CONFIG, LOCAL_CONFIG], ids=lambda c: c.name)


@CONFIGS
@pytest.mark.skipif(not Path(HAPROXY).exists(), reason="needs haproxy")
def test_haproxy_accepts_the_config_with_its_defaults_and_no_warning(config: Path) -> None:
    checked = subprocess.run(
        [HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert checked.returncode == 0, checked.stderr
    assert "Configuration file is valid" in checked.stdout + checked.stderr
    assert "WARNING" not in checked.stdout + checked.stderr


@CONFIGS
def test_the_log_format_leaves_the_query_string_out(config: Path) -> None:
    (line,) = [line for line in config.read_text().splitlines() if "log-format" in line]
    fields = set(line.replace('"', " ").split())
    assert "%HPO" in fields  # the path alone
    assert not {"%r", "%HU", "%HQ", "%hr", "%CC"} & fields


def test_one_address_at_the_handshake_bound_fills_under_a_quarter_of_the_session_table() -> None:
    per_minute = int(config_default("WSCHAT_HANDSHAKES_PER_MINUTE"))
    size = int(config_default("WSCHAT_SESSION_TABLE_SIZE").replace("k", "000"))
    (expire,) = re.findall(
        r'size "\$\{WSCHAT_SESSION_TABLE_SIZE-[^}]*\}" expire (\d+)h', CONFIG.read_text()
    )
    assert per_minute * int(expire) * 60 < size / 4  # docs/deploy.md "Sizing the stick table"


def routing_lines(config: Path) -> list[str]:
    """The config's directives less what names the replicas: the DNS resolvers, the servers,
    the defaults of its variables."""
    lines, section = [], ""
    for raw in config.read_text().splitlines():
        line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("log-format") else raw
        if not line:
            continue
        if not raw[0].isspace():
            section = line.split()[0]
        if section == "resolvers" or line.split()[0] in ("server", "server-template"):
            continue
        line = line.split(" resolvers ", 1)[0]  # default-server: how its slots resolve
        lines.append(re.sub(r"\$\{(\w+)-[^}]*\}", r"${\1}", line.strip()))
    return lines


def test_the_local_config_routes_by_the_same_lines_as_the_compose_one() -> None:
    assert routing_lines(LOCAL_CONFIG) == routing_lines(CONFIG)
