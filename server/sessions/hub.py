"""``Hub``: what all connections share: settings, the engine, generation slots, connection
quotas, the gates of costly work (gates.py), server stats and the ``SessionStore`` (store.py:
in memory or in Redis)."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..engine import Engine
from ..settings import UNBATCHED_CONCURRENT, Settings
from .gates import Gate
from .quotas import ConnectionCaps
from .session import DETACHED_STATES, Session
from .slots import GenerationSlots
from .snapshot import import_state
from .stats import ServerStats
from .store import SessionStore, open_store

if TYPE_CHECKING:
    from .connection import Connection


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
    connections: set[Connection] = field(default_factory=set)
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

    def new_session(self, key: str | None = None) -> Session:
        assert self.engine is not None
        session = Session(
            key or secrets.token_hex(8),
            self.engine,
            self.slots,
            self.settings,
            image_checks=self.image_checks,
        )
        session.listeners.append(self.stats.on_run_event)
        session.on_rewind = self.stats.count_rewind
        session.boundary = self.sessions.checkpoint
        session.progress = self.sessions.progress
        return session

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
