"""What an engine raises for a turn it refuses; the session layer gives each its wire code.

    EngineError
    ├── ImagesUnsupported  the model reads no images
    ├── TooLarge           a system prompt or a turn's text over what the engine allows
    └── ContextOverflow    the conversation and the turn do not fit the context

A failure while generating is not raised: it ends the generation with ``Finished(ERROR)``.
"""

from __future__ import annotations


class EngineError(Exception):
    """A turn the engine refuses; the message says why and is safe to show the peer."""


class ImagesUnsupported(EngineError):
    pass


class TooLarge(EngineError):
    pass


class ContextOverflow(EngineError):
    pass
