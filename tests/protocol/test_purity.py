"""``protocol`` is pure: importing it loads no I/O framework, no torch, nothing of ours beyond
itself (STYLE.md 1)."""

from __future__ import annotations

from tests.support import modules_loaded_by

FORBIDDEN = ("asyncio", "torch", "transformers", "starlette", "uvicorn", "websockets", "numpy")
OURS = ("wschat.server", "wschat.client", "bench", "tests")

PROBE = """
import wschat.protocol
from wschat.protocol import decode_client_frame, encode, Ping
decode_client_frame(encode(Ping(1)))
"""


def loaded_by_importing_protocol() -> list[str]:
    return modules_loaded_by(PROBE)


def test_importing_protocol_loads_no_io_framework_torch_or_our_other_packages() -> None:
    loaded = loaded_by_importing_protocol()
    assert "wschat.protocol" in loaded and "msgpack" in loaded  # the probe really imported it
    ours = sorted(n for n in loaded if n.startswith(OURS))
    tops = {name.split(".")[0] for name in loaded}
    assert sorted(tops & set(FORBIDDEN)) == [] and ours == []
