"""deploy/haproxy.cfg as written: HAProxy 2.6 accepts it, what it logs of a request leaves
the query string (the resume token, a bearer token) out, and one address at its handshake bound
cannot fill the session table within the entries' expiry."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.deploy.cluster import CONFIG, HAPROXY
from tests.deploy.test_compose import config_default
from tests.support import TIMEOUT


@pytest.mark.skipif(not Path(HAPROXY).exists(), reason="needs haproxy")
def test_haproxy_accepts_the_config_with_its_defaults_and_no_warning() -> None:
    checked = subprocess.run(
        [HAPROXY, "-c", "-f", str(CONFIG)], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert checked.returncode == 0, checked.stderr
    assert "Configuration file is valid" in checked.stdout + checked.stderr
    assert "WARNING" not in checked.stdout + checked.stderr


def test_the_log_format_leaves_the_query_string_out() -> None:
    (line,) = [line for line in CONFIG.read_text().splitlines() if "log-format" in line]
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
