"""The wschat server: a Starlette WebSocket app that streams a transformers model."""
