"""The OpenAI Responses API, over HTTP and over its WebSocket mode: a door onto the same
sessions as the chat API (run.py drives each response as a chat completion is driven).
``request`` (a create body read into ours), ``conversation`` (a create as the session's input),
``kept`` (the responses kept, per owner), ``shapes`` (the response object and its events),
``run`` (one response), ``routes`` (HTTP) and ``socket`` (the WebSocket mode)."""

from .routes import ResponsesApi

__all__ = ["ResponsesApi"]
