"""``EngineFailure``: a generation that failed for a reason the client may be told.

Any other exception that ends a generation is ``internal`` with a fixed message; this one carries
the stable code (``overloaded``, ``context_overflow``, ...) and a message written for clients,
never the engine's own text (which is logged).
"""

from __future__ import annotations

from wschat.protocol import ErrorCode


class EngineFailure(Exception):
    def __init__(self, code: ErrorCode, message: str, *, detail: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        # What the engine said: for the log only.
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.message} ({self.detail})" if self.detail else self.message
