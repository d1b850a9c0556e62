"""deploy/haproxy.cfg as written: HAProxy 2.6 accepts it, and what it logs of a request leaves
the query string (the resume token, a bearer token) out."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.deploy.cluster import CONFIG, HAPROXY
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
