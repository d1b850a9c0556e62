"""``python -m tests.hardening.scripted_server PORT [--fail-load]``: the real ``serve`` (signals,
drain) on the scripted engine, for the shutdown test. A prompt with ``long`` in it runs for a
minute; any other runs for about a second. With ``--fail-load`` the engine's factory raises
instead, as a model that cannot load does."""

from __future__ import annotations

import logging
import sys

from wschat.server.engine import Engine, GenerationRequest
from wschat.server.engine.scripted import Script, ScriptedEngine
from wschat.server.serve import serve
from wschat.server.settings import Settings

LONG_MARK = [300 + ord(c) for c in "long"]


def script(request: GenerationRequest) -> Script:
    ids = request.prompt_ids
    is_long = any(ids[i : i + 4] == LONG_MARK for i in range(len(ids)))
    if is_long:
        return Script([f" l{i}" for i in range(1200)], delay_s=0.05)
    return Script([f" s{i}" for i in range(10)], delay_s=0.1)


def refuse_to_load() -> Engine:
    raise RuntimeError("the scripted engine refuses to load")


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    settings = Settings(
        port=int(sys.argv[1]), max_concurrent=4, shutdown_grace_s=2.0, ping_interval_s=0.0
    )
    if "--fail-load" in sys.argv[2:]:
        return serve(settings, refuse_to_load)
    return serve(settings, ScriptedEngine(script))


if __name__ == "__main__":
    raise SystemExit(main())
