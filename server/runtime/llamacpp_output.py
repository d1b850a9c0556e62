"""What a line of llama.cpp's server's output becomes in our log (``supervisor.py`` reads the
child's two pipes and relays each line through ``relayed``).

llama.cpp's own lines ("0.01.206.038 I srv          init: listening on ...") keep their level:
``D`` and ``I`` at debug (five lines a request), ``W`` at warning, ``E`` at error, except the
warnings in ``HARMLESS``, which say nothing wrong with a server we started and go to debug. A
line not in that format (Python's own, a traceback's) is a warning.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

# llama.cpp's log lines: "0.01.206.038 I srv          init: listening on ..."
LOG_LINE = re.compile(r"^\d+\.\d+\.\d+\.\d+ ([DIWE]) +(.*)$")
LEVELS = {"D": logging.DEBUG, "I": logging.DEBUG, "W": logging.WARNING, "E": logging.ERROR}

# llama.cpp's warnings that every start (or every cancelled reply) logs, each with why it is
# harmless here; a warning that contains one of these goes to debug.
HARMLESS = {
    # "load: control-looking token: 212 '</s>' was not control-type; this is probably a bug in
    # the model. its type will be overridden"
    "this is probably a bug in the model": (
        "Gemma 3's vocabulary has '</s>' (212) as an ordinary token and llama.cpp makes it a "
        "control token; Gemma 3 ends a turn with <end_of_turn> or <eos>, never '</s>', and our "
        "prompts reach it as token ids, so the change touches nothing we send or read"
    ),
    # "llama_kv_cache_iswa: using full-size SWA cache (ref: ...)"
    "using full-size SWA cache": (
        "we ask for it (--swa-full): the sliding layers' whole KV is what lets a next turn "
        "reuse the earlier ones"
    ),
    # "srv stop: cancel task, id_task = 28"
    "cancel task": (
        "a reply we stopped (a cancel, a client gone, a reply past its stall timeout): "
        "llama.cpp drops its task when we close the stream"
    ),
}


@dataclass(frozen=True, slots=True)
class Relayed:
    """One output line as our log takes it."""

    level: int
    text: str  # whitespace collapsed
    llama_cpp: bool  # in llama.cpp's log format (else Python's own, or the launcher's)


def relayed(line: str) -> Relayed:
    """``line`` (one line, its end of line stripped) as our log takes it."""
    match = LOG_LINE.match(line)
    if match is None:
        return Relayed(logging.WARNING, " ".join(line.split()), llama_cpp=False)
    text = " ".join(match[2].split())
    level = LEVELS[match[1]]
    if level == logging.WARNING and any(mark in text for mark in HARMLESS):
        level = logging.DEBUG
    return Relayed(level, text, llama_cpp=True)
