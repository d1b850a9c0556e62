"""The rules every log record goes through (server/runtime/redaction.py), one at a time; the
whole of it in a real gateway's log is tests/hardening/test_logs.py."""

from __future__ import annotations

import logging

from wschat.server.runtime.redaction import LogHygiene, escape_controls

KEY = "sk-live-abcdefghijklmnop"


def record(message: str, *args: object, error: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(error), error, error.__traceback__) if error is not None else None
    return logging.LogRecord("wschat.run", logging.ERROR, __file__, 1, message, args, exc_info)


def test_a_known_secret_and_any_bearer_token_are_hidden_in_the_message_and_the_traceback() -> None:
    hygiene = LogHygiene()
    hygiene.add_secrets([KEY, None, ""])
    try:
        raise RuntimeError(f"the engine said: bad key {KEY}")
    except RuntimeError as error:
        made = record("failed: %s; header Bearer %s", error, "other-token.v2==", error=error)
    hygiene.clean_record(made)
    assert made.getMessage() == "failed: the engine said: bad key …; header Bearer …"
    assert made.exc_text is not None and "bad key …" in made.exc_text
    assert KEY not in made.exc_text and made.exc_text.count("\n") > 1  # still a traceback


def test_control_characters_and_unicode_line_breaks_are_escaped() -> None:
    said = "p\r\n2026 ERROR forged\x1b[2K\x85\u2028\u2029\tend"
    assert escape_controls(said) == "p\\r\\n2026 ERROR forged\\x1b[2K\\x85\\u2028\\u2029\\tend"
    assert escape_controls("plain text, é and 中文") == "plain text, é and 中文"


def test_query_strings_are_hidden_in_uvicorns_lines_only() -> None:
    hygiene = LogHygiene()
    line = '127.0.0.1:5 - "WebSocket /v1/chat?resume=abc&token=t" [accepted]'
    assert hygiene.clean(line, "uvicorn.error") == '127.0.0.1:5 - "WebSocket /v1/chat?…" [accepted]'
    assert hygiene.clean("is it ready? yes", "wschat.app") == "is it ready? yes"


def test_a_record_that_cannot_be_formatted_is_left_to_logging() -> None:
    made = record("%d items", "not a number")
    LogHygiene().clean_record(made)
    assert (made.msg, made.args) == ("%d items", ("not a number",))
