"""The names of our packages and of the server's layers, as the import rules of
``test_layering.py`` and ``test_interfaces.py`` read them."""

from __future__ import annotations

SERVER = "wschat.server"
ENGINE = "wschat.server.engine"
SESSIONS = "wschat.server.sessions"
WEB = "wschat.server.web"
LOCAL_ENGINES = "wschat.server.engine.local"
OPENAI_ENGINE = "wschat.server.engine.openai"
CLIENT = "wschat.client"
# bottom to top: a layer may import its own modules and those of the layers before it
LAYERS = tuple(f"{SERVER}.{name}" for name in ("engine", "sessions", "web", "runtime"))
SETTINGS = f"{SERVER}.settings"
RUNTIME = f"{SERVER}.runtime"
