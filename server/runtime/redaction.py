"""Log hygiene: no secret in the logs, and no line a client can forge.

Every record, whichever logger made it (ours, uvicorn's, httpx's...), is cleaned as it is made
(a record factory, so no handler or logger is left out):

- the secrets this process knows (the engine's API key, the bearer tokens clients present, the
  session store's password) and any ``Bearer ...`` / ``Authorization: ...`` become ``…``, in the
  message and in a logged exception's traceback: an engine's error body may echo our key;
- control characters and line breaks in the message are escaped (``\\n``, ``\\x1b``...): a
  prompt id or an engine's message is the client's or the engine's text, and a line break in
  it would otherwise start a line of its own that reads as ours;
- uvicorn's lines lose their query strings (``?resume=``, ``?token=``), its ``bearer.``
  subprotocols and, at debug level where it logs raw headers, the value of every header but a
  few that never carry credentials.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from urllib.parse import urlsplit

from ..settings import Settings

HIDDEN = "…"

_CREDENTIALS = (
    (re.compile(r"(?i)(authorization:\s*)\S.*"), rf"\1{HIDDEN}"),
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/-]+=*"), rf"\1{HIDDEN}"),
    (re.compile(r"(?i)\bbearer\.[^\s,]*"), f"bearer.{HIDDEN}"),
)
_QUERY = re.compile(r"\?[^\s\"']*")
# One header of a handshake as the WebSocket layer logs it at debug level: "< name: value".
_HEADER_LINE = re.compile(r"^([<>] )([!#$%&'*+.^_`|~0-9A-Za-z-]+):(.*)$", re.DOTALL)
_HEADERS_SHOWN = frozenset(
    {
        "host",
        "origin",
        "upgrade",
        "connection",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-key",
        "sec-websocket-accept",
        "user-agent",
        "content-type",
        "content-length",
        "date",
        "server",
    }
)
# C0 and C1 controls, DEL, and the Unicode line and paragraph separators: each can end a line in
# a terminal or a log viewer
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_controls(text: str) -> str:
    return _CONTROLS.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    char = match[0]
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


class LogHygiene:
    """The secrets to hide and the rules above; ``clean`` applies them to one message."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._secrets: tuple[str, ...] = ()

    def add_secrets(self, secrets: Iterable[str | None]) -> None:
        with self._lock:
            known = set(self._secrets) | {s for s in secrets if s}
            # longest first: a secret that contains another is hidden whole
            self._secrets = tuple(sorted(known, key=len, reverse=True))

    def hide_secrets(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, HIDDEN)
        for pattern, replacement in _CREDENTIALS:
            text = pattern.sub(replacement, text)
        return text

    def clean(self, message: str, logger: str) -> str:
        if logger.startswith("uvicorn"):
            message = _uvicorn_line(message)
        return escape_controls(self.hide_secrets(message))

    def clean_record(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: logging reports it where it would have anyway
            return
        cleaned = self.clean(message, record.name or "")  # makeLogRecord's may have none
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        if record.exc_info and not record.exc_text:
            # a traceback stays multi-line (it is ours), but an exception's message may hold
            # an engine's words
            traceback = logging.Formatter().formatException(record.exc_info)
            record.exc_text = self.hide_secrets(traceback)


def _uvicorn_line(message: str) -> str:
    header = _HEADER_LINE.match(message)
    if header is not None and header[2].lower() not in _HEADERS_SHOWN:
        return f"{header[1]}{header[2]}: {HIDDEN}"
    return _QUERY.sub(f"?{HIDDEN}", message)


HYGIENE = LogHygiene()
_installed = False
_install_lock = threading.Lock()


def settings_secrets(settings: Settings) -> list[str | None]:
    """What ``settings`` holds that must never be logged."""
    store = urlsplit(settings.session_store) if "://" in settings.session_store else None
    return [settings.engine_api_key, *settings.tokens, store.password if store else None]


def install_log_filters(secrets: Iterable[str | None] = ()) -> None:
    """Clean every log record this process makes from now on (once per process; later calls
    add ``secrets``)."""
    global _installed
    HYGIENE.add_secrets(secrets)
    with _install_lock:
        if _installed:
            return
        _installed = True
        make_record = logging.getLogRecordFactory()

        def cleaned_record(*args: object, **kwargs: object) -> logging.LogRecord:
            record = make_record(*args, **kwargs)
            HYGIENE.clean_record(record)
            return record

        logging.setLogRecordFactory(cleaned_record)
