"""``python -m tests.hardening.scripted_server PORT [--option value ...]``: the real ``serve``
(signals, drain) on the scripted engine, for tests that need the server in a process of its own
(signals, RSS, descriptor limits). Options are ``wschat-server``'s. A prompt with ``long`` in it
runs for a minute; one with ``steady`` for 4 s (``STEADY_REPLY``); one with ``flood`` streams
20 MB of text in 2 s; one with ``burst`` streams 20 MB at once and then nothing for a minute
(still running); any other runs for about a second. With ``--fail-load`` the engine's factory
raises instead, as a model that cannot load does; with ``--hold-load`` it takes two minutes to
return, as a model loading."""

from __future__ import annotations

import logging
import sys
import threading

from wschat.server.engine import Engine, GenerationRequest
from wschat.server.runtime.cli import settings_from_args
from wschat.server.runtime.serve import serve

from tests.fakes.scripted import Script, ScriptedEngine

DEFAULTS = ["--max-concurrent", "4", "--shutdown-grace-s", "2", "--ping-interval-s", "0"]
LONG_MARK = [300 + ord(c) for c in "long"]
FLOOD_MARK = [300 + ord(c) for c in "flood"]
BURST_MARK = [300 + ord(c) for c in "burst"]
HOLD_S = 120.0
STEADY_MARK = [300 + ord(c) for c in "steady"]
STEADY_TOKENS = [f" m{i}" for i in range(40)]
STEADY_REPLY = "".join(STEADY_TOKENS)


def _has(ids: list[int], mark: list[int]) -> bool:
    return any(ids[i : i + len(mark)] == mark for i in range(len(ids)))


def script(request: GenerationRequest) -> Script:
    ids = request.prompt_ids
    if _has(ids, FLOOD_MARK):
        return Script(["x" * 20_000] * 1000, delay_s=0.002, end_with_eos=False)
    if _has(ids, BURST_MARK):  # the stall ends after 60 s, or at the engine's aclose
        return Script(["x" * 20_000] * 1000 + [" end"], end_with_eos=False, stall_after=1000)
    if _has(ids, STEADY_MARK):
        return Script(STEADY_TOKENS, delay_s=0.1)
    if _has(ids, LONG_MARK):
        return Script([f" l{i}" for i in range(1200)], delay_s=0.05)
    return Script([f" s{i}" for i in range(10)], delay_s=0.1)


def refuse_to_load() -> Engine:
    raise RuntimeError("the scripted engine refuses to load")


def load_for_two_minutes() -> Engine:
    threading.Event().wait(HOLD_S)  # the test kills the process before
    return ScriptedEngine(script)


LOADS = {"--fail-load": refuse_to_load, "--hold-load": load_for_two_minutes}


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    port, *options = sys.argv[1:]
    load = next((LOADS[o] for o in options if o in LOADS), None)
    options = [o for o in options if o not in LOADS]
    settings = settings_from_args(["--port", port, *DEFAULTS, *options])
    return serve(settings, load or ScriptedEngine(script))


if __name__ == "__main__":
    raise SystemExit(main())
