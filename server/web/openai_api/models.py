"""``GET /v1/models`` and ``GET /v1/models/{id}`` (the SDK's ``models.list`` and
``models.retrieve``): the model served, in OpenAI's shape.

Its id is short (``gemma-3-270m``), as clients put it in their configuration: an engine's model
name may carry a description after it in parentheses (the embedded model's is
``gemma-3-270m (embedded, from GGUF Q4_K_M)``), which the model object keeps as
``description``; /readyz and the WebSocket's ``ready`` show the whole name. A request may name
either, or anything else: the model served answers it, named by its id.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...engine import EngineInfo
from ...sessions import Hub
from .errors import ApiError

OWNER = "wschat"


def model_id(info: EngineInfo) -> str:
    """The short id of the model ``info`` names: its name without the description."""
    return info.model.split(" (", 1)[0]


class Models:
    def __init__(self, hub: Hub, admit: Callable[[Request], None]) -> None:
        self.hub = hub
        self._admit = admit  # the API's checks: tokens, Origin, the model loaded

    async def list(self, request: Request) -> Response:
        try:
            self._admit(request)
        except ApiError as e:
            return e.response()
        return JSONResponse({"object": "list", "data": [self._card()]})

    async def retrieve(self, request: Request) -> Response:
        try:
            self._admit(request)
        except ApiError as e:
            return e.response()
        name = request.path_params["model"]
        info = self._info()
        if name not in (model_id(info), info.model):
            shown = name if len(name) <= 80 else name[:79] + "…"
            error = ApiError(
                f"the model {shown!r} does not exist; this server serves {model_id(info)!r}",
                status=404,
                param="model",
                code="model_not_found",
            )
            return error.response()
        return JSONResponse(self._card())

    def _info(self) -> EngineInfo:
        engine = self.hub.engine
        assert engine is not None  # admitted: the model is loaded
        return engine.info

    def _card(self) -> dict[str, Any]:
        info = self._info()
        card: dict[str, Any] = {
            "id": model_id(info),
            "object": "model",
            "created": int(time.time() - self.hub.stats.uptime_s),
            "owned_by": OWNER,
        }
        if info.model != card["id"]:
            card["description"] = info.model
        return card
