"""``RedisSessionStore``: sessions kept in Redis, so any replica can resume them.

Its keys, and the rules each script keeps over them: redis_scripts.py.

While a connection holds a session, its replica renews the lease every third of
``--session-lease-s`` and the state's and token's TTLs with it (the window plus the lease); at
detach the owner key goes and the others live out the resume window. A claim is one Lua script:
the token is read, refused while a live owner holds the session, else deleted (single-use) and
the session taken over, so of two replicas racing one token exactly one gets it. A refused claim
is tried again until the owner's lease lapses (its replica died, or its connection is ending),
for at most a little over the lease; then the client gets a new session. Each try carries a
deadline on Redis's own clock (its ``TIME`` just before): a claim Redis runs later, after this
process gave up on it (Redis stalled), changes nothing, so the token still works afterwards.

A state (with its reply checkpoint) over ``max_state_bytes`` is refused by the claim's script by
its size alone and dropped unread. Any other claimed state is read, checked and rebuilt in a
worker thread: each list, string and image within what a live session holds
(``snapshot.Bounds``), its ids within the engine's vocabulary and context, its engine's
fingerprint this engine's (``snapshot.import_state``); any other state is refused, logged, and
the client gets a new session. What a claim rebuilds is the stored state; a turn that was
running in it (its replica died mid-reply, or the claim beat a reply held elsewhere) joins the
conversation as a cancelled exchange with the checkpointed tokens. The replica that held that
reply finds out at its next write (the owner is another) and lets it go. A claim of a reply held
here takes the session as it is in memory, its reply still going, so the client is sent every
token it missed.

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
from .redis_scripts import TIMEOUT_S, RedisScripts
from .session import Session
from .snapshot import Bounds, export_state, pack, reply_checkpoint, unpack
from .states import DETACHED_STATES, SessionState
from .store import Claim, Rebuild

log = logging.getLogger("wschat.store")

MAX_BACKOFF_S = 1.0
MAX_TOKEN_CHARS = 64
REPLY_CHECKPOINT_S = 1.0  # a crash loses at most this much of a running reply
CLAIM_POLL_S = 0.1  # a refused claim is tried again this often...
CLAIM_MARGIN_S = 1.0  # ...until the lease plus this is over
# a claim Redis runs later than this after its TIME changes nothing: under the socket timeout,
# after which this process gives up, less the answer's way back
CLAIM_DEADLINE_S = TIMEOUT_S / 2
HELD = "~"  # an owner value's prefix: a reply goes on there without a connection

STORE_ERRORS = (RedisError, OSError, asyncio.TimeoutError)


class RedisSessionStore:
    shared = True

    def __init__(self, settings: Settings, rebuild: Rebuild) -> None:
        self.settings = settings
        self.resume_window_s = settings.resume_window_s
        self.lease_s = settings.session_lease_s
        self.bounds = Bounds.of(settings)
        self.max_state_bytes = self.bounds.state_bytes
        self._rebuild = rebuild
        self.replica = secrets.token_hex(8)  # this process, as an owner
        self.client = aioredis.from_url(
            settings.session_store, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S
        )
        self.scripts = RedisScripts(self.client, self.replica)
        self.live: dict[str, Session] = {}
        self._tokens: dict[str, str] = {}  # session key -> its current resume token
        self._stored: dict[str, str] = {}  # session key -> the token this replica last wrote
        self._dirty: dict[str, tuple[Session, float | None]] = {}  # key -> (session, give up at)
        self._detaching: dict[str, Session] = {}  # detached, their last write not yet done
        self._ended: list[Session] = []  # detached and written (or given up): expire() them
        # detached mid-reply, the reply going on here for --resume-grace-s: a claim here takes
        # the session as it is; let go (written, then ended) once the grace is over
        self._held: dict[str, Session] = {}
        self._holds: dict[str, asyncio.Task[None]] = {}  # each held session's _hold, by key
        self._growing: dict[str, Session] = {}  # running replies to checkpoint, by key
        self._wake = asyncio.Event()
        self._writing = False  # a write taken off _dirty is under way
        self._tasks: list[asyncio.Task[None]] = []
        self.errors = 0
        self._down_since: float | None = None

    # -- the interface ----------------------------------------------------------------------

    @property
    def detached_count(self) -> int:
        return len(self._detaching) + len(self._held)

    async def add(self, session: Session) -> str:
        self._start()
        self.live[session.key] = session
        token = secrets.token_urlsafe(24)
        self._tokens[session.key] = token
        self._stored.pop(session.key, None)
        self.checkpoint(session)
        return token

    async def claim(self, token: str) -> Claim:
        if len(token) > MAX_TOKEN_CHARS:
            return Claim(None)
        give_up_at = time.monotonic() + self.lease_s + CLAIM_MARGIN_S
        try:
            while (result := await self._claim_once(token))[0] == 2:
                left = give_up_at - time.monotonic()
                if left <= 0:
                    log.info("resume refused: the session is still held by a live connection")
                    return Claim(None)
                # its owner's lease lapses unless renewed: a replica that died, a connection
                # ending (nothing to await in this process: the owner may be another one)
                await asyncio.sleep(min(CLAIM_POLL_S, left, max(result[1], 1) / 1000))
        except STORE_ERRORS as e:
            self._failed("claim", e)
            return Claim(None, "the session store is unavailable")
        self._recovered()
        if result[0] == 4:
            key, size = result[1].decode(), result[2]
            log.error(
                "session %s: its stored state is refused unread (%d bytes, over %d); a new session",
                key,
                size,
                self.max_state_bytes,
            )
        if result[0] != 1:
            return Claim(None)
        key = result[1].decode()
        held = self._unhold(key)
        if held is not None:
            return Claim(held)  # its reply goes on here
        try:
            session = await asyncio.to_thread(self._restore, key, result[2], result[3])
        except Exception as e:  # whatever a made-up state raises, it is refused
            log.error("session %s: its stored state is refused (%s); a new session", key, e)
            return Claim(None)
        return Claim(session)

    def _restore(self, key: str, state: bytes, partial: bytes) -> Session:
        """A claimed session from its stored bytes, in a worker thread: a large or made-up state
        is read and checked without holding up the event loop (``ValueError`` refuses it)."""
        checkpoint = unpack(partial, self.bounds) if partial else None
        return self._rebuild(key, unpack(state, self.bounds), checkpoint)

    async def _claim_once(self, token: str) -> list[Any]:
        return await self.scripts.claim(token, self.lease_s, CLAIM_DEADLINE_S, self.max_state_bytes)

    def checkpoint(self, session: Session) -> None:
        key = session.key
        if key in self.live or key in self._detaching or key in self._held:
            self._dirty[key] = (session, self._dirty.get(key, (None, None))[1])
            self._wake.set()

    def progress(self, session: Session) -> None:
        if session.key in self.live or session.key in self._held:
            self._growing[session.key] = session

    async def detach(self, session: Session) -> bool:
        self.live.pop(session.key, None)
        if self.resume_window_s <= 0 or session.state is SessionState.CLOSED:
            self._dirty.pop(session.key, None)
            self._spawn(self._release(session))
            self._forget_token(session.key)
            return False
        if session.state in DETACHED_STATES:  # dropped mid-reply: it goes on here for a while
            self._held[session.key] = session
            self._dirty[session.key] = (session, None)
            self._wake.set()
            self._holds[session.key] = self._spawn(self._hold(session))
            return True
        self._let_go(session)
        return True

    def _let_go(self, session: Session) -> None:
        """Detached: its last state is written, then this process forgets it."""
        self._detaching[session.key] = session
        self._dirty[session.key] = (session, time.monotonic() + self.resume_window_s)
        self._wake.set()

    async def _hold(self, session: Session) -> None:
        """A reply that goes on here without a connection, for the grace period (the session
        cancels it then); once it is over, the session is let go like any detached one."""
        await asyncio.sleep(self.settings.resume_grace_s)
        task = session.generation_task
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=TIMEOUT_S * 5)  # cancelled: it ends at once
        self._holds.pop(session.key, None)
        if self._held.pop(session.key, None) is not None:
            self._let_go(session)

    def _unhold(self, key: str) -> Session | None:
        """A held session, no longer held: claimed here, or lost to another replica."""
        hold = self._holds.pop(key, None)
        if hold is not None and hold is not asyncio.current_task():
            hold.cancel()
        return self._held.pop(key, None)

    def _lost(self, session: Session) -> None:
        """Another replica claimed a session whose reply was held here: the reply stops."""
        if self._held.get(session.key) is session:
            log.info("session %s: resumed on another replica; its reply here stops", session.key)
            self._unhold(session.key)
            self._growing.pop(session.key, None)
            self._forget_token(session.key)
            self._spawn(session.stop_generation())
            self._ended.append(session)

    def expire(self) -> list[Session]:
        ended, self._ended = self._ended, []
        return ended

    def detached(self) -> list[Session]:
        return [*self._detaching.values(), *self._held.values()]

    async def aclose(self) -> None:
        with contextlib.suppress(TimeoutError):  # the last states (a shutdown's cancelled replies)
            async with asyncio.timeout(TIMEOUT_S * 2):
                while self._tasks and (self._dirty or self._writing):
                    await asyncio.sleep(0.01)  # the write loop's progress: no event to await
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
                asyncio.create_task(self._reply_loop()),
            ]

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.append(task)
        task.add_done_callback(self._forget_task)
        return task

    def _forget_task(self, task: asyncio.Task[None]) -> None:
        if task in self._tasks:
            self._tasks.remove(task)

    def _mode(self, key: str) -> str:
        """How ``WRITE`` (redis_scripts.py) leaves the owner key."""
        return "live" if key in self.live else "held" if key in self._held else "gone"

    async def _write_loop(self) -> None:
        backoff = 0.05
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._dirty:
                key, (session, give_up_at) = next(iter(self._dirty.items()))
                del self._dirty[key]
                self._writing = True
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
                finally:
                    self._writing = False
                backoff = 0.05
                self._recovered()
                if key not in self._dirty:
                    self._written(session)

    def _written(self, session: Session) -> None:
        """A detached session's last state is kept (or given up): this process lets it go."""
        if self._detaching.get(session.key) is session and session.key not in self.live:
            del self._detaching[session.key]
            self._forget_token(session.key)
            self._ended.append(session)

    def _forget_token(self, key: str) -> None:
        self._tokens.pop(key, None)
        self._stored.pop(key, None)

    async def _write(self, session: Session) -> None:
        token = self._tokens.get(session.key)
        if token is None:
            return
        data = pack(export_state(session))
        if len(data) > self.max_state_bytes:
            log.warning(
                "session %s: its state is %d bytes, over %d: not kept for resumption",
                session.key,
                len(data),
                self.max_state_bytes,
            )
            await self.scripts.drop(session.key, token)
            return
        mode = self._mode(session.key)
        ttl = self.resume_window_s + (self.lease_s if mode != "gone" else 0)
        first = self._first(session.key, token)
        written = await self.scripts.write(session.key, token, data, ttl, self.lease_s, mode, first)
        if written == 1:
            self._stored[session.key] = token
        elif session.key in self._held:
            self._lost(session)
        else:
            log.warning("session %s: another replica owns it now; not written", session.key)

    async def _reply_loop(self) -> None:
        """Running replies' checkpoints, at most one per session per REPLY_CHECKPOINT_S."""
        while True:
            await asyncio.sleep(REPLY_CHECKPOINT_S)
            growing, self._growing = self._growing, {}
            for key, session in growing.items():
                partial = reply_checkpoint(session)
                token = self._tokens.get(key)
                if partial is None or token is None:
                    continue
                ttl = self.resume_window_s + self.lease_s
                first = self._first(key, token)
                try:
                    written = await self.scripts.reply(key, token, pack(partial), ttl, first)
                except STORE_ERRORS as e:
                    self._failed("checkpoint", e)
                    self._growing = {**growing, **self._growing}  # all again, next time
                    break
                self._recovered()
                if written == 0:
                    self._lost(session)

    def _first(self, key: str, token: str) -> str:
        """'1' until this replica has written ``token``: a missing owner is no claim till then
        (the token was in no one's hands)."""
        return "0" if self._stored.get(key) == token else "1"

    async def _release(self, session: Session) -> None:
        """A session that is not kept: its keys go (once, best effort: they expire anyway)."""
        token = self._tokens.get(session.key, "-")
        try:
            await self.scripts.drop(session.key, token)
        except STORE_ERRORS as e:
            self._failed("release", e)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            for key in list(self.live):
                token = self._tokens.get(key)
                if token is None or key in self._dirty:
                    continue  # its write renews the lease
                ttl = self.resume_window_s + self.lease_s
                try:
                    renewed = await self.scripts.heartbeat(key, token, self.lease_s, ttl)
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
