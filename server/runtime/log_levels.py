"""The lines other libraries log for every connection or request, at debug level here: at info
the log says what the server does (it listens, it is ready, it drains), not each visitor.

- uvicorn's ``"WebSocket /v1/chat" [accepted]`` and the WebSocket layer's ``connection open``
  and ``connection closed``: two or three lines a connection (uvicorn's HTTP access log is off,
  ``serve.uvicorn_config``). A client waiting for the model to load reconnects every 2 s: 23
  pairs in 46 s; ``web/admission.py`` logs one line per waiting client instead. A refused
  handshake (403) stays at info.
- httpx's ``HTTP Request: ...``: one a request to a remote engine, and one for every
  ``/readyz`` that asks the engine's health (a load balancer asks every 2 s).

A line moved here keeps its logger and becomes a debug record, which ``--log-level debug``
shows.
"""

from __future__ import annotations

import logging

# the logger and the message formats (a record's ``msg``, before its arguments) moved to debug
ROUTINE = {
    "uvicorn.error": ('%s - "WebSocket %s" [accepted]', "connection open", "connection closed"),
    "httpx": ('HTTP Request: %s %s "%s %d %s"',),
}


class ToDebug(logging.Filter):
    """Makes an info record whose format is one of ``formats`` a debug record, dropped where its
    logger does not take debug records."""

    def __init__(self, formats: tuple[str, ...]) -> None:
        super().__init__()
        self.formats = frozenset(formats)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or record.msg not in self.formats:
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def routine_lines_to_debug() -> None:
    """Install ``ToDebug`` on each logger of ``ROUTINE`` (once, however often called)."""
    for name, formats in ROUTINE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, ToDebug) for f in logger.filters):
            logger.addFilter(ToDebug(formats))
