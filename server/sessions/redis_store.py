"""``RedisSessionStore``: sessions kept in Redis, so any replica can resume them.

Keys (every one with a TTL, so the store holds nothing past the resume window):

    wschat:s:<session>   its state (snapshot.py), written at each turn boundary and at detach
    wschat:t:<token>     the session a resume token names
    wschat:o:<session>   its owner: the replica whose connection holds it (a lease)

While a connection holds a session, its replica renews the lease every third of
``--session-lease-s`` and the other two keys' TTLs with it (the window plus the lease); at
detach the owner key goes and the others live out the resume window. A claim is one Lua script:
the token is read, refused while an owner holds the session, else deleted (single-use) and the
session taken over, so of two replicas racing one token exactly one gets it.

Writes do not hold up the session: a boundary marks it dirty and one task writes the latest
state, retrying with a backoff while Redis is down (a detached session's write is given up once
its window is over). Every failed operation counts in ``errors``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from ..settings import Settings
from .session import Session, SessionState
from .snapshot import SnapshotError, pack, unpack
from .store import Claim, Rebuild

log = logging.getLogger("wschat.store")

PREFIX = "wschat:"
TIMEOUT_S = 1.0  # one Redis round trip; past it the store counts as down
MAX_BACKOFF_S = 1.0
MAX_TOKEN_CHARS = 64

# KEYS: the token; ARGV: the owner, the lease (ms), the prefix. {0}: no such token or
# session; {2}: owned by a live connection (the token stays); {1, key, state}: claimed.
_CLAIM = """
local key = redis.call('GET', KEYS[1])
if not key then return {0} end
local owner = ARGV[3] .. 'o:' .. key
if redis.call('EXISTS', owner) == 1 then return {2} end
redis.call('DEL', KEYS[1])
local state = redis.call('GET', ARGV[3] .. 's:' .. key)
if not state then return {0} end
redis.call('SET', owner, ARGV[1], 'PX', ARGV[2])
return {1, key, state}
"""

# KEYS: state, token, owner; ARGV: state, session key, ttl (ms), owner, lease (ms), live.
# 0: another replica owns the session now (nothing written).
_WRITE = """
local current = redis.call('GET', KEYS[3])
if current and current ~= ARGV[4] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
if ARGV[6] == '1' then
  redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[5])
elseif current then
  redis.call('DEL', KEYS[3])
end
return 1
"""

# KEYS: state, token, owner; ARGV: owner, lease (ms), ttl (ms). 0: owned by another replica;
# -1: the state is gone (Redis lost it): write it again.
_HEARTBEAT = """
local current = redis.call('GET', KEYS[3])
if current and current ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
"""

# KEYS: state, token, owner; ARGV: owner. A state too large to keep: a resume gets a new
# session rather than an old state.
_DROP = """
local current = redis.call('GET', KEYS[3])
if current and current ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return 1
"""

STORE_ERRORS = (RedisError, OSError, asyncio.TimeoutError)


class RedisSessionStore:
    def __init__(self, settings: Settings, rebuild: Rebuild) -> None:
        self.settings = settings
        self.resume_window_s = settings.resume_window_s
        self.lease_s = settings.session_lease_s
        # the in-memory limits: images within max_session_image_bytes, ids within the context
        self.max_state_bytes = settings.max_session_image_bytes + 16 * settings.context_tokens
        self.max_state_bytes += 1 << 20
        self._rebuild = rebuild
        self.replica = secrets.token_hex(8)  # this process, as an owner
        self.client = aioredis.from_url(
            settings.session_store, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S
        )
        self._claim = self.client.register_script(_CLAIM)
        self._write_script = self.client.register_script(_WRITE)
        self._heartbeat_script = self.client.register_script(_HEARTBEAT)
        self._drop = self.client.register_script(_DROP)
        self.live: dict[str, Session] = {}
        self._tokens: dict[str, str] = {}  # session key -> its current resume token
        self._dirty: dict[str, tuple[Session, float | None]] = {}  # key -> (session, give up at)
        self._detaching: dict[str, Session] = {}  # detached, their last write not yet done
        self._ended: list[Session] = []  # detached and written (or given up): expire() them
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.errors = 0
        self._down_since: float | None = None

    # -- the interface ----------------------------------------------------------------------

    @property
    def detached_count(self) -> int:
        return len(self._detaching)

    async def add(self, session: Session) -> str:
        self._start()
        self.live[session.key] = session
        token = secrets.token_urlsafe(24)
        self._tokens[session.key] = token
        self.checkpoint(session)
        return token

    async def claim(self, token: str) -> Claim:
        if len(token) > MAX_TOKEN_CHARS:
            return Claim(None)
        try:
            async with asyncio.timeout(TIMEOUT_S * 2):
                result = await self._claim(
                    keys=[f"{PREFIX}t:{token}"],
                    args=[self.replica, self._ms(self.lease_s), PREFIX],
                )
        except STORE_ERRORS as e:
            self._failed("claim", e)
            return Claim(None, "the session store is unavailable")
        self._recovered()
        if result[0] == 2:
            log.info("resume refused: the session is still held by a live connection")
            return Claim(None)
        if result[0] != 1:
            return Claim(None)
        key, data = result[1].decode(), result[2]
        try:
            session = self._rebuild(key, unpack(data))
        except (SnapshotError, ValueError) as e:
            log.error("session %s: its stored state does not rebuild (%s); a new session", key, e)
            return Claim(None)
        return Claim(session)

    def checkpoint(self, session: Session) -> None:
        if session.key in self.live or session.key in self._detaching:
            self._dirty[session.key] = (session, self._dirty.get(session.key, (None, None))[1])
            self._wake.set()

    async def detach(self, session: Session) -> bool:
        self.live.pop(session.key, None)
        if self.resume_window_s <= 0 or session.state is SessionState.CLOSED:
            self._dirty.pop(session.key, None)
            self._tokens.pop(session.key, None)
            self._spawn(self._release(session))
            return False
        self._detaching[session.key] = session
        self._dirty[session.key] = (session, time.monotonic() + self.resume_window_s)
        self._wake.set()
        return True

    def expire(self) -> list[Session]:
        ended, self._ended = self._ended, []
        return ended

    def detached(self) -> list[Session]:
        return list(self._detaching.values())

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        self._tasks.clear()
        with contextlib.suppress(*STORE_ERRORS):
            await self.client.aclose()

    # -- writing ------------------------------------------------------------------------------

    def _start(self) -> None:
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._write_loop()),
                asyncio.create_task(self._heartbeat_loop()),
            ]

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.append(task)
        task.add_done_callback(self._forget_task)

    def _forget_task(self, task: asyncio.Task[None]) -> None:
        if task in self._tasks:
            self._tasks.remove(task)

    def _ms(self, seconds: float) -> int:
        return max(1, int(seconds * 1000))

    def _keys(self, key: str, token: str) -> list[str]:
        return [f"{PREFIX}s:{key}", f"{PREFIX}t:{token}", f"{PREFIX}o:{key}"]

    async def _write_loop(self) -> None:
        backoff = 0.05
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._dirty:
                key, (session, give_up_at) = next(iter(self._dirty.items()))
                del self._dirty[key]
                try:
                    await self._write(session)
                except STORE_ERRORS as e:
                    self._failed("write", e)
                    if give_up_at is not None and time.monotonic() >= give_up_at:
                        self._written(session)  # its window is over: nothing left to keep
                    else:
                        self._dirty.setdefault(key, (session, give_up_at))
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                    continue
                backoff = 0.05
                self._recovered()
                if key not in self._dirty:
                    self._written(session)

    def _written(self, session: Session) -> None:
        """A detached session's last state is kept (or given up): this process lets it go."""
        if self._detaching.get(session.key) is session and session.key not in self.live:
            del self._detaching[session.key]
            self._tokens.pop(session.key, None)
            self._ended.append(session)

    async def _write(self, session: Session) -> None:
        token = self._tokens.get(session.key)
        if token is None:
            return
        keys = self._keys(session.key, token)
        data = pack(session.export_state())
        async with asyncio.timeout(TIMEOUT_S * 2):
            if len(data) > self.max_state_bytes:
                log.warning(
                    "session %s: its state is %d bytes, over %d: not kept for resumption",
                    session.key,
                    len(data),
                    self.max_state_bytes,
                )
                await self._drop(keys=keys, args=[self.replica])
                return
            live = session.key in self.live
            ttl = self.resume_window_s + (self.lease_s if live else 0)
            written = await self._write_script(
                keys=keys,
                args=[
                    data,
                    session.key,
                    self._ms(ttl),
                    self.replica,
                    self._ms(self.lease_s),
                    "1" if live else "0",
                ],
            )
        if written == 0:
            log.warning("session %s: another replica owns it now; not written", session.key)

    async def _release(self, session: Session) -> None:
        """A session that is not kept: its keys go (once, best effort: they expire anyway)."""
        token = self._tokens.get(session.key, "-")
        try:
            async with asyncio.timeout(TIMEOUT_S * 2):
                await self._drop(keys=self._keys(session.key, token), args=[self.replica])
        except STORE_ERRORS as e:
            self._failed("release", e)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            for key in list(self.live):
                token = self._tokens.get(key)
                if token is None or key in self._dirty:
                    continue  # its write renews the lease
                try:
                    async with asyncio.timeout(TIMEOUT_S * 2):
                        renewed = await self._heartbeat_script(
                            keys=self._keys(key, token),
                            args=[
                                self.replica,
                                self._ms(self.lease_s),
                                self._ms(self.resume_window_s + self.lease_s),
                            ],
                        )
                except STORE_ERRORS as e:
                    self._failed("heartbeat", e)
                    if key in self.live:
                        self.checkpoint(self.live[key])  # written again once Redis is back
                    break
                self._recovered()
                if renewed == -1 and key in self.live:  # Redis lost it (restarted empty)
                    self.checkpoint(self.live[key])
                elif renewed == 0:
                    log.warning("session %s: its lease is held by another replica", key)

    # -- health -------------------------------------------------------------------------------

    def _failed(self, what: str, error: BaseException) -> None:
        self.errors += 1
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning("session store: %s failed (%s): retrying", what, error or type(error))
        else:
            log.debug("session store: %s failed again (%s)", what, error)

    def _recovered(self) -> None:
        if self._down_since is not None:
            down = time.monotonic() - self._down_since
            self._down_since = None
            log.warning("session store: reachable again after %.1f s", down)
