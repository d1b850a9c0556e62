"""Run the app under uvicorn with the engine the settings name."""

from __future__ import annotations

import logging

import uvicorn

from .app import build_app
from .engine import Engine
from .settings import Settings

log = logging.getLogger("wschat.serve")


def make_engine(settings: Settings) -> Engine:
    from .engine.hf import HFEngine
    from .loader import load_model

    loaded = load_model(
        settings.model, cache_dir=settings.cache_dir, device=settings.device, dtype=settings.dtype
    )
    return HFEngine(
        loaded,
        context_tokens=settings.context_tokens,
        max_images=settings.max_images,
        kv_budget_tokens=settings.kv_budget_tokens,
    )


def uvicorn_config(settings: Settings, app: object) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        ws="websockets-sansio",
        # Frames over max_frame_bytes get a too_large error; far over it, uvicorn closes 1009.
        ws_max_size=2 * settings.max_frame_bytes,
        ws_ping_interval=settings.ping_interval_s or None,
        ws_ping_timeout=settings.ping_interval_s or None,
        log_level=settings.log_level,
        access_log=False,
        lifespan="on",
    )


def serve(settings: Settings) -> int:
    app = build_app(settings, lambda: make_engine(settings))
    server = uvicorn.Server(uvicorn_config(settings, app))
    server.run()
    return 0
