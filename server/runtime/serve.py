"""Run the app under uvicorn: its config, the server that says when it can chat, ``serve``."""

from __future__ import annotations

import gc
import logging
import socket
import sys

import uvicorn
from starlette.types import ASGIApp

from ..engine import Engine
from ..settings import Settings
from ..web.app import EngineFactory, build_app
from .engines import make_engine
from .http_protocol import http_protocol
from .log_levels import routine_lines_to_debug
from .redaction import install_log_filters, settings_secrets
from .shutdown import CLOSE_S, GracefulServer
from .transport import raise_descriptor_limit, websocket_protocol

log = logging.getLogger("wschat.serve")


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
        if self.started and sockets is not None:
            # uvicorn says where it listens only on the sockets it opened itself, and ``serve``
            # opens them
            self._log_started_message(sockets)
        if self.started and self.hub.engine is None:
            log.info(NOT_READY)


class CannotListen(Exception):
    """The address cannot be listened on (in use, not this machine's, not allowed)."""


def listen(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Sockets listening on every address ``host`` names, as uvicorn's own would be. Bound before
    the model loads, so that a port in use is said at once rather than after the load, and no
    other process can take the port meanwhile."""
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    sockets: list[socket.socket] = []
    try:
        found = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        for family, kind, proto, _, address in dict.fromkeys(found):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # "::" and "0.0.0.0" are two sockets, as in asyncio
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
    except OSError as error:
        for sock in sockets:
            sock.close()
        reason = error.strerror or str(error)
        raise CannotListen(f"cannot listen on {shown}: {reason[:1].lower()}{reason[1:]}") from None
    return sockets


def frozen_after(make: EngineFactory) -> EngineFactory:
    """``make``, then what it loaded moved out of the garbage collector's reach
    (``gc.freeze``): the model's modules and the tokenizer's vocabulary (~420,000 objects for
    the embedded model) live as long as the process, and each full collection would walk them
    all in the middle of replies (164 ms a pass on a quiet Xeon core, ~0.9 s on a busy one)."""

    def load() -> Engine:
        engine = make()
        gc.collect()  # the loading's own garbage first: what is frozen is never collected
        gc.freeze()
        return engine

    return load


def serve(settings: Settings, engine: Engine | EngineFactory | None = None) -> int:
    """Serve until SIGTERM/SIGINT, drain (``shutdown.drain``): exit status 0. When the address
    cannot be listened on, one line on stderr and exit status 1 before the model loads; when the
    model fails to load, stop at once: exit status 1, the reason in the log."""
    install_log_filters(settings_secrets(settings))
    app = build_app(settings, engine or frozen_after(lambda: make_engine(settings)))
    config = uvicorn_config(settings, app)  # configures uvicorn's loggers
    routine_lines_to_debug()
    try:  # the model loads once uvicorn starts (the app's lifespan)
        sockets = listen(settings.host, settings.port, config.backlog)
    except CannotListen as error:
        print(f"wschat-server: {error}", file=sys.stderr)
        return 1
    server = ChatServer(config, app.state.hub, app.state.stats_feed, settings.shutdown_grace_s)
    raise_descriptor_limit(settings)
    server.run(sockets=sockets)
    return 0 if app.state.hub.load_error is None else 1
