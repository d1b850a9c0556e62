"""The Lua scripts ``RedisSessionStore`` (redis_store.py) runs, each one atomic on Redis: a
claim of a resume token, a state's write, a reply's checkpoint, a live session's heartbeat, and
the drop of a state too large to keep; and ``RedisScripts``, which runs each with its keys and
arguments in the order the script reads them.

Keys (every one with a TTL, so the store holds nothing past the resume window):

    wschat:s:<session>   its state (snapshot.py), written at each turn boundary and at detach;
                         a reply's start is one, so a running turn is in it as it was prompted
    wschat:r:<session>   the running reply's checkpoint: its id and tokens so far, written at
                         most once a second while it grows
    wschat:t:<token>     the session a resume token names
    wschat:o:<session>   its owner: the replica whose connection holds it (a lease), or
                         ``~<replica>`` while that replica goes on with a reply whose connection
                         dropped (``--resume-grace-s``): held, but any replica may claim it

Only another replica's owner value means a session is no longer this replica's: a missing owner
key is none (the session's first write is still queued, or a lease lapsed), unless the token this
replica last wrote is gone, which only a claim does.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis

PREFIX = "wschat:"
TIMEOUT_S = 1.0  # one Redis round trip; past it the store counts as down

# KEYS: the token; ARGV: the owner, the lease (ms), the prefix, the deadline (Redis's clock, ms),
# the most bytes a state and its reply checkpoint may hold together.
# {0}: no such token or session; {2, ms}: owned by a live connection, its lease lapses in ms
# (the token stays); {3}: past the deadline (nothing changed); {4, key, bytes}: over the most
# bytes, refused and dropped unread (STRLEN is O(1): a huge value is never sent, which would hold
# Redis and this replica up while it crosses the socket); {1, key, state, reply checkpoint or
# ''}: claimed (from a held owner too).
CLAIM = """
local now = redis.call('TIME')
if tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) > tonumber(ARGV[4]) then
  return {3}
end
local key = redis.call('GET', KEYS[1])
if not key then return {0} end
local owner = ARGV[3] .. 'o:' .. key
local current = redis.call('GET', owner)
if current and string.sub(current, 1, 1) ~= '~' then
  return {2, redis.call('PTTL', owner)}
end
redis.call('DEL', KEYS[1])
local state_key, reply_key = ARGV[3] .. 's:' .. key, ARGV[3] .. 'r:' .. key
local size = redis.call('STRLEN', state_key) + redis.call('STRLEN', reply_key)
if size > tonumber(ARGV[5]) then
  redis.call('DEL', state_key, reply_key)
  return {4, key, size}
end
local state = redis.call('GET', state_key)
if not state then return {0} end
redis.call('SET', owner, ARGV[1], 'PX', ARGV[2])
local reply = redis.call('GET', reply_key)
return {1, key, state, reply or ''}
"""

# Whether this replica (``me``) may still write a session: the owner is itself (live or held),
# or there is no owner and the token is not one this replica wrote before (``first``: its
# first write) or is still there (a claim deletes it).
OURS = """
local function ours(current, me, token, first)
  if current then return current == me or current == '~' .. me end
  return first == '1' or redis.call('EXISTS', token) == 1
end
"""

# KEYS: state, token, owner; ARGV: state, session key, ttl (ms), owner, lease (ms), mode:
# 'live' (a connection here: the lease), 'held' (a reply goes on here without one: '~owner',
# which only this replica's writes may follow) or 'gone' (let go: no owner), first ('1': the
# token's first write). 0: another replica owns the session now (nothing written).
WRITE = (
    OURS
    + """
local current = redis.call('GET', KEYS[3])
local held = '~' .. ARGV[4]
if not ours(current, ARGV[4], KEYS[2], ARGV[7]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
if ARGV[6] == 'live' then
  redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[5])
elseif ARGV[6] == 'held' then
  redis.call('SET', KEYS[3], held, 'PX', ARGV[3])
elseif current then
  redis.call('DEL', KEYS[3])
end
return 1
"""
)

# KEYS: reply checkpoint, owner, token; ARGV: checkpoint, ttl (ms), owner, first. 0: not this
# replica's now.
REPLY = (
    OURS
    + """
if not ours(redis.call('GET', KEYS[2]), ARGV[3], KEYS[3], ARGV[4]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
)

# KEYS: state, token, owner; ARGV: owner, lease (ms), ttl (ms). 0: owned by another replica;
# -1: the state is gone (Redis lost it): write it again.
HEARTBEAT = """
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
DROP = """
local current = redis.call('GET', KEYS[3])
if current and current ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
return 1
"""


def ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def session_keys(key: str, token: str) -> list[str]:
    """A session's state, token, owner and reply checkpoint keys."""
    return [f"{PREFIX}s:{key}", f"{PREFIX}t:{token}", f"{PREFIX}o:{key}", f"{PREFIX}r:{key}"]


class RedisScripts:
    """The scripts above on one client, each run for this replica (``replica``, its owner value)
    within two round trips (the client's socket timeout gives up first)."""

    def __init__(self, client: aioredis.Redis, replica: str) -> None:
        self.client = client
        self.replica = replica
        self._claim = client.register_script(CLAIM)
        self._write = client.register_script(WRITE)
        self._reply = client.register_script(REPLY)
        self._heartbeat = client.register_script(HEARTBEAT)
        self._drop = client.register_script(DROP)

    async def claim(self, token: str, lease_s: float, late_s: float, most_bytes: int) -> list[Any]:
        """``CLAIM``'s answer; one Redis ran more than ``late_s`` after its ``TIME`` (read just
        before) raises ``TimeoutError``: nothing was claimed."""
        async with asyncio.timeout(TIMEOUT_S * 2):
            seconds, micros = await self.client.time()
        deadline = seconds * 1000 + micros // 1000 + ms(late_s)
        async with asyncio.timeout(TIMEOUT_S * 2):
            result: list[Any] = await self._claim(
                keys=[f"{PREFIX}t:{token}"],
                args=[self.replica, ms(lease_s), PREFIX, deadline, most_bytes],
            )
        if result[0] == 3:
            raise TimeoutError("Redis ran the claim past its deadline: nothing was claimed")
        return result

    async def write(
        self,
        key: str,
        token: str,
        state: bytes,
        ttl_s: float,
        lease_s: float,
        mode: str,
        first: str,
    ) -> int:
        """``WRITE``: 1 written, 0 another replica's now."""
        args: list[bytes | str | int] = [state, key, ms(ttl_s), self.replica, ms(lease_s), mode]
        args.append(first)
        async with asyncio.timeout(TIMEOUT_S * 2):
            written: int = await self._write(keys=session_keys(key, token), args=args)
        return written

    async def reply(self, key: str, token: str, checkpoint: bytes, ttl_s: float, first: str) -> int:
        """``REPLY``: 1 written, 0 another replica's now."""
        keys = [f"{PREFIX}r:{key}", f"{PREFIX}o:{key}", f"{PREFIX}t:{token}"]
        async with asyncio.timeout(TIMEOUT_S * 2):
            written: int = await self._reply(
                keys=keys, args=[checkpoint, ms(ttl_s), self.replica, first]
            )
        return written

    async def heartbeat(self, key: str, token: str, lease_s: float, ttl_s: float) -> int:
        """``HEARTBEAT``: 1 renewed, 0 another replica's, -1 its state is gone."""
        args: list[str | int] = [self.replica, ms(lease_s), ms(ttl_s)]
        async with asyncio.timeout(TIMEOUT_S * 2):
            renewed: int = await self._heartbeat(keys=session_keys(key, token), args=args)
        return renewed

    async def drop(self, key: str, token: str) -> None:
        """``DROP``: the session's keys go, unless another replica owns it."""
        async with asyncio.timeout(TIMEOUT_S * 2):
            await self._drop(keys=session_keys(key, token), args=[self.replica])
