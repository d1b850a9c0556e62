"""What an engine raises or ends a generation with; the session layer gives each its wire code
(``ENGINE_ERRORS`` in sessions/error_boundary.py), so the engine knows no wire codes.

    EngineError                    ``message`` is worded for the peer; ``detail`` is the log's only
    ├── TurnRefused                raised before anything is generated: the chat is unchanged
    │   ├── ImagesUnsupported      (unsupported) the model reads no images
    │   ├── PromptTooLong          (too_large) a system prompt or a turn's text over the limit
    │   ├── ConversationTooLong    (context_overflow) the conversation and turn exceed the context
    │   ├── SchemaRefused          (invalid_params) a response format's schema the grammar library
    │   │                          cannot compile; the message holds the library's reason
    │   └── FeatureUnsupported     (unsupported) a field the engine cannot serve (a response
    │                              format or logprobs on a remote engine that takes none)
    └── GenerationFailure          ends a generation: ``Finished(ERROR, error=...)``, not raised
        ├── EngineOverloaded       (overloaded) busy, unreachable or out of memory; the message
        │                          says when to retry
        ├── ContextExhausted       (context_overflow) the engine found the context too small
        ├── EngineFailed           (internal) the engine failed or stopped mid-reply
        └── CallArgumentsInvalid   (internal) a call whose arguments do not match its tool's
                                   schema (tool_arguments.py); the exchange is not kept

Any other exception a generation ends with is a bug, which the peer sees as a generic
``internal``.
"""

from __future__ import annotations


class EngineError(Exception):
    def __init__(self, message: str, *, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        # What the engine itself said (an HTTP body, a library's exception): for the log only.
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.message} ({self.detail})" if self.detail else self.message


class TurnRefused(EngineError):
    """A turn (or system prompt) the engine refuses before generating."""


class ImagesUnsupported(TurnRefused):
    pass


class PromptTooLong(TurnRefused):
    pass


class ConversationTooLong(TurnRefused):
    pass


class SchemaRefused(TurnRefused):
    @classmethod
    def because(cls, reason: str) -> SchemaRefused:
        """The grammar library's ``reason``, in the words every engine tells the peer."""
        return cls(f"response_format: the schema cannot be enforced: {reason}")


class FeatureUnsupported(TurnRefused):
    pass


class GenerationFailure(EngineError):
    """Why a generation ended in ``ERROR``, in words the peer may be shown."""


class EngineOverloaded(GenerationFailure):
    def __init__(self, message: str, *, retry_s: float, detail: str = "") -> None:
        super().__init__(message, detail=detail)
        self.retry_s = retry_s

    @classmethod
    def retry_in(cls, why: str, retry_s: float, *, detail: str = "") -> EngineOverloaded:
        """``why``, and when to retry, in the words every engine tells the peer."""
        return cls(f"{why}; retry in {retry_s:g} s", retry_s=retry_s, detail=detail)


class ContextExhausted(GenerationFailure):
    pass


class EngineFailed(GenerationFailure):
    pass


class CallArgumentsInvalid(GenerationFailure):
    pass
