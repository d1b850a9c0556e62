"""Log redaction: nothing uvicorn logs may carry a token."""

from __future__ import annotations

import logging
import re


class SecretsFilter(logging.Filter):
    """Redact what could carry a token from every line uvicorn logs: query strings, ``bearer.``
    subprotocols and, at debug level where it logs raw headers, the value of every header but
    a few that never carry credentials (a token sent in a cookie or a header of its own is not
    read by the server, but must not be logged either)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = _redact(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True


_SECRETS = (
    (re.compile(r"\?[^\s\"']*"), "?…"),
    (re.compile(r"(?i)(authorization:\s*)\S.*"), r"\1…"),
    (re.compile(r"(?i)\bbearer\.[^\s,]*"), "bearer.…"),
)
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


def _redact(message: str) -> str:
    header = _HEADER_LINE.match(message)
    if header is not None and header[2].lower() not in _HEADERS_SHOWN:
        return f"{header[1]}{header[2]}: …"
    for pattern, replacement in _SECRETS:
        message = pattern.sub(replacement, message)
    return message


def install_log_filters() -> None:
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, SecretsFilter) for f in logger.filters):
            logger.addFilter(SecretsFilter())
