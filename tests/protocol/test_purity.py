"""``protocol`` is pure: importing it loads no I/O framework, no torch, nothing of ours beyond
itself (STYLE.md 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("asyncio", "torch", "transformers", "starlette", "uvicorn", "websockets", "numpy")
OURS = ("wschat.server", "wschat.client", "bench", "tests")

PROBE = """
import json, sys
before = set(sys.modules)
import wschat.protocol
from wschat.protocol import decode_client_frame, encode, Ping
decode_client_frame(encode(Ping(1)))
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def loaded_by_importing_protocol() -> list[str]:
    result = subprocess.run(
        [sys.executable, "-I", "-c", PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_importing_protocol_loads_no_io_framework_torch_or_our_other_packages() -> None:
    loaded = loaded_by_importing_protocol()
    assert "wschat.protocol" in loaded and "msgpack" in loaded  # the probe really imported it
    ours = sorted(n for n in loaded if n.startswith(OURS))
    tops = {name.split(".")[0] for name in loaded}
    assert sorted(tops & set(FORBIDDEN)) == [] and ours == []
