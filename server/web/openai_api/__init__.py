"""The OpenAI-compatible HTTP API beside the WebSocket: ``requests`` (bodies read into ours),
``conversation`` (a request as a session), ``prefix_keys`` (the engine session keys requests run
under, for their KV reuse), ``errors`` (OpenAI's error shape) and ``routes``."""

from .routes import OpenAIApi

__all__ = ["OpenAIApi"]
