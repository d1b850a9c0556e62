"""``Hub``: what all connections share: settings, the engine, generation slots, connection
quotas, the gates of costly work (gates.py), server stats and the ``SessionStore`` (store.py:
in memory or in Redis, the one ``--session-store`` names: ``open_store``)."""

from __future__ import annotations

import asyncio
import functools
import secrets
from dataclasses import dataclass, field
from typing import Any, Protocol

from wschat.protocol import CloseCode, Frame

from ..engine import Chat, Engine
from ..settings import STORE_SCHEMES, UNBATCHED_CONCURRENT, Settings
from .core import SessionCore
from .error_boundary import Send
from .events import RunListener
from .gates import Gate
from .hooks import EngineKeys, SessionHooks
from .limits import PromptLimits
from .quotas import ConnectionCaps
from .session import Session
from .slots import GenerationSlots
from .snapshot import import_state
from .states import DETACHED_STATES
from .stats import OPENAI_API, ServerStats
from .store import MemorySessionStore, Rebuild, SessionStore


def open_store(settings: Settings, rebuild: Rebuild) -> SessionStore:
    """The store ``--session-store`` names: ``memory``, or a Redis URL."""
    if settings.session_store == "memory":
        return MemorySessionStore(settings.resume_window_s, settings.max_connections)
    if not settings.session_store.startswith(STORE_SCHEMES):
        raise ValueError(f"--session-store: 'memory' or a URL starting {', '.join(STORE_SCHEMES)}")
    from .redis_store import RedisSessionStore  # redis-py loads only when it is used

    return RedisSessionStore(settings, rebuild)


class Door(Protocol):
    """A connection serving a chat's session (web/connection.py), as a drain ends it
    (runtime/shutdown.py)."""

    session: Session

    async def send(self, frame: Frame) -> None: ...

    async def close(self, code: CloseCode, reason: str) -> None: ...


@dataclass(eq=False)
class Hub:
    settings: Settings
    engine: Engine | None = None
    slots: GenerationSlots = field(init=False)
    sessions: SessionStore = field(init=False)
    stats: ServerStats = field(init=False)
    caps: ConnectionCaps = field(init=False)
    replays: Gate = field(init=False)  # replays to resumed connections being written
    image_checks: Gate = field(init=False)  # uploads being decoded and checked
    connections: set[Door] = field(default_factory=set)  # the chats' connections
    # the sessions of HTTP API requests running or waiting (web/openai_api): never in the store
    requests: set[Session] = field(default_factory=set)
    load_error: BaseException | None = None  # set once, when the engine factory raised
    # the addresses told that the model is still loading (web/admission.py logs each once)
    told_loading: set[str] = field(default_factory=set)
    shutting_down: bool = False

    def __post_init__(self) -> None:
        # until the engine is loaded and says its batch width (set_engine), under auto
        width = self.settings.max_concurrent or UNBATCHED_CONCURRENT
        self.slots = GenerationSlots(width, self.settings.max_queue)
        self.sessions = open_store(self.settings, self.restore_session)
        self.stats = ServerStats()
        self.caps = ConnectionCaps(
            self.settings.max_connections, self.settings.max_connections_per_client
        )
        self.replays = Gate(self.settings.max_replays)
        self.image_checks = Gate(self.settings.max_image_checks)

    def set_engine(self, engine: Engine) -> None:
        """The engine, loaded; under ``--max-concurrent auto`` the slots take its batch width
        (no chat runs before this, so no ticket is held yet)."""
        self.engine = engine
        if self.settings.max_concurrent is None and engine.info.batch_width:
            self.slots.max_concurrent = engine.info.batch_width

    def new_session(
        self,
        key: str | None = None,
        *,
        address: str = "unknown",
        scope: str = "",
        outbox: Send | None = None,
        hooks: SessionHooks | None = None,
    ) -> Session:
        """A chat's session, the store's (``hooks``: its boundaries saved, its rewinds counted);
        ``address`` and ``scope``: its connection's client and owner (``access.owner_scope``);
        ``outbox``: where its frames go from the start (else a connection ``attach``es one)."""
        hooks = hooks or SessionHooks(
            self.sessions.checkpoint, self.sessions.progress, self.stats.count_rewind
        )
        listener = self.stats.on_run_event
        return self._session(key or secrets.token_hex(8), address, scope, outbox, hooks, listener)

    def new_request(
        self, *, address: str, scope: str, outbox: Send, keys: EngineKeys, api: str = OPENAI_API
    ) -> Session:
        """An API request's session (web/openai_api, web/responses): never in the store, never
        resumed; each run under the engine session key ``keys`` picks, counted under ``api``."""
        key = f"api-{secrets.token_hex(8)}"
        listener = functools.partial(self.stats.on_run_event, api=api)
        return self._session(key, address, scope, outbox, SessionHooks(), listener, keys)

    def _session(
        self,
        key: str,
        address: str,
        scope: str,
        outbox: Send | None,
        hooks: SessionHooks,
        listener: RunListener,
        keys: EngineKeys | None = None,
    ) -> Session:
        """The one place a session is made: its core and what drives it, each collaborator
        given at construction."""
        engine, settings = self.engine, self.settings
        assert engine is not None
        chat = Chat(engine, key)
        limits = PromptLimits.of(settings)
        core = SessionCore(key, chat, self.slots, limits, address=address, scope=scope)
        return Session(
            core,
            engine,
            settings,
            max_images=min(settings.max_images, engine.info.max_images),
            image_checks=self.image_checks,
            listeners=[listener],
            hooks=hooks,
            keys=keys,
            outbox=outbox,
        )

    def restore_session(
        self, key: str, state: dict[str, Any], partial: dict[str, Any] | None = None
    ) -> Session:
        """A session another connection (maybe another replica) left, from its state and the
        checkpoint of the reply it was generating (``snapshot.import_state``); ``ValueError``
        when the state is not one this engine can take. The Redis store calls it in a worker
        thread (a stored state may be large): it must touch nothing that belongs to the loop."""
        session = self.new_session(key)
        try:
            import_state(session, state, partial)
        except Exception:
            session.chat.close()
            raise
        return session

    async def end_connection(self, session: Session) -> None:
        """After its connection is over: keep ``session`` for resumption, or close it and
        forget its engine state; the same for detached sessions past their window."""
        gone = [] if await self.sessions.detach(session) else [session]
        for ended in [*gone, *self.sessions.expire()]:
            await ended.close()
            self.forget(ended)

    def forget(self, session: Session) -> None:
        session.chat.close()

    async def stop_held_replies(self) -> None:
        """Cancel the replies that go on without a connection for a resume (shutdown)."""
        held = [s for s in self.sessions.detached() if s.state in DETACHED_STATES]
        await asyncio.gather(*(s.stop_generation() for s in held))

    async def aclose(self) -> None:
        await self.stop_held_replies()
        await self.sessions.aclose()
