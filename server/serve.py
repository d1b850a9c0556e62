"""Run the app under uvicorn with the engine the settings name."""

from __future__ import annotations

import logging
import re
import socket
import threading
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from .app import EngineFactory, build_app
from .engine import Engine
from .settings import ENGINES, Settings
from .shutdown import CLOSE_S, GracefulServer
from .transport import http_protocol, raise_descriptor_limit, websocket_protocol

log = logging.getLogger("wschat.serve")


def make_engine(settings: Settings) -> Engine:
    """The engine ``settings.engine`` names: 'batched' (BatchedEngine) or 'generate' (HFEngine).

    Loading runs in a thread of its own that exits once it is done. OpenMP keeps a pool of
    workers per live thread that has run a parallel region, and while two such threads live
    each one's parallel regions run far slower (on 2 cores, a bf16 decode step took 1.6x as
    long in the engine's worker as in the thread that loaded the model); so no thread but the
    engine's may keep a pool.
    """
    if settings.engine not in ENGINES:
        raise ValueError(f"unknown engine {settings.engine!r}: choose one of {ENGINES}")
    if settings.engine == "openai":
        return _connect_openai(settings)
    made: list[Engine] = []
    failed: list[BaseException] = []

    def build() -> None:
        try:
            made.append(_build_engine(settings))
        except BaseException as error:
            failed.append(error)

    loader = threading.Thread(target=build, name="wschat-load")
    loader.start()
    loader.join()
    if failed:
        raise failed[0]
    return made[0]


def _connect_openai(settings: Settings) -> Engine:
    """No model here: the gateway's tokenizer, and an engine that answers over HTTP."""
    from .engine.openai import OpenAIEngineConfig, connect
    from .engine.openai.tokenizer import default_cache_dir

    return connect(
        OpenAIEngineConfig(
            url=settings.engine_url,
            tokenizer=settings.tokenizer,
            cache_dir=settings.cache_dir or default_cache_dir(),
            model=settings.engine_model,
            api_key=settings.engine_api_key,
            prompt_format=settings.prompt_format,
            context_tokens=settings.context_tokens,
            images=settings.engine_images,
        )
    )


def _build_engine(settings: Settings) -> Engine:
    from .engine.threads import ThreadPolicy
    from .loader import load_model

    threads = ThreadPolicy(settings.threads)
    log.info("CPU threads: %s", threads.reason)
    loaded = load_model(
        settings.model, cache_dir=settings.cache_dir, device=settings.device, dtype=settings.dtype
    )
    common: dict[str, Any] = {
        "prompt_format": settings.prompt_format,
        "context_tokens": settings.context_tokens,
        "max_images": settings.max_images,
        "kv_budget_bytes": settings.kv_budget_mib << 20,
    }
    engine: Engine
    if settings.engine == "batched":
        from .engine.batched import BatchedEngine

        engine = BatchedEngine(
            loaded,
            width=settings.max_concurrent,
            prefill_tokens=settings.prefill_chunk_tokens,
            threads=threads,
            **common,
        )
    else:
        from .engine.hf import HFEngine

        engine = HFEngine(loaded, threads=threads, **common)
    info = engine.info
    log.info(
        "engine %s: %s on %s (%s), %d generations at once, prompt format %s",
        info.name,
        info.model,
        info.device,
        info.dtype,
        settings.max_concurrent,
        info.prompt_format,
    )
    return engine


class SecretsFilter(logging.Filter):
    """Redact what could carry a token from every line uvicorn logs: query strings, ``bearer.``
    subprotocols and, at debug level where it logs raw headers, the value of every header but
    a few that never carry credentials (a token sent in a cookie or a header of its own is not
    read by the server, but must not be logged either)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = _redact(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True


_SECRETS = (
    (re.compile(r"\?[^\s\"']*"), "?…"),
    (re.compile(r"(?i)(authorization:\s*)\S.*"), r"\1…"),
    (re.compile(r"(?i)\bbearer\.[^\s,]*"), "bearer.…"),
)
# One header of a handshake as the WebSocket layer logs it at debug level: "< name: value".
_HEADER_LINE = re.compile(r"^([<>] )([!#$%&'*+.^_`|~0-9A-Za-z-]+):(.*)$", re.DOTALL)
_HEADERS_SHOWN = frozenset(
    {
        "host",
        "origin",
        "upgrade",
        "connection",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-key",
        "sec-websocket-accept",
        "user-agent",
        "content-type",
        "content-length",
        "date",
        "server",
    }
)


def _redact(message: str) -> str:
    header = _HEADER_LINE.match(message)
    if header is not None and header[2].lower() not in _HEADERS_SHOWN:
        return f"{header[1]}{header[2]}: …"
    for pattern, replacement in _SECRETS:
        message = pattern.sub(replacement, message)
    return message


def install_log_filters() -> None:
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, SecretsFilter) for f in logger.filters):
            logger.addFilter(SecretsFilter())


def uvicorn_config(settings: Settings, app: ASGIApp) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=http_protocol(settings),
        ws=websocket_protocol(settings),
        # Frames over max_frame_bytes get a too_large error; far over it, uvicorn closes 1009.
        ws_max_size=2 * settings.max_frame_bytes,
        # No permessage-deflate: with it, one 256 kB read can inflate into dozens of messages
        # near ws_max_size at once; our frames are small and msgpack (README "Security and
        # limits" has the measurement).
        ws_per_message_deflate=False,
        ws_ping_interval=settings.ping_interval_s or None,
        ws_ping_timeout=settings.ping_interval_s or None,
        # what is still open once the drain is over (or its deadline passed) is not waited for
        timeout_graceful_shutdown=CLOSE_S,
        log_level=settings.log_level,
        access_log=False,
        lifespan="on",
        # X-Forwarded-For names the client only when a trusted proxy sent it: uvicorn's default
        # trusts loopback, which let any local peer pick its address for the caps and the logs
        proxy_headers=bool(settings.forwarded_allow_ips),
        forwarded_allow_ips=list(settings.forwarded_allow_ips) or None,
    )


NOT_READY = "not ready yet: loading the model (chats are closed with 1013 until it is loaded)"


class ChatServer(GracefulServer):
    """uvicorn's server, saying when it listens before it can chat.

    uvicorn logs "running on http://..." as soon as it listens, which on a first start is a
    minute before the model is loaded; this line, and ``app._load``'s "ready" line, tell the truth.
    """

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.hub.engine is None:
            log.info(NOT_READY)


def serve(settings: Settings, engine: Engine | EngineFactory | None = None) -> int:
    """Serve until SIGTERM/SIGINT, drain (``shutdown.drain``): exit status 0. When the model
    fails to load, stop at once: exit status 1, the reason in the log."""
    app = build_app(settings, engine or (lambda: make_engine(settings)))
    config = uvicorn_config(settings, app)
    server = ChatServer(config, app.state.hub, settings.shutdown_grace_s)
    install_log_filters()  # after Config, which (re)configures uvicorn's loggers
    raise_descriptor_limit(settings)
    server.run()
    return 0 if app.state.hub.load_error is None else 1
