"""A replicated deployment on loopback, every part a real process started by the test and
stopped by its pid: ``redis-server``, two gateway replicas (the real ``serve`` on the scripted
engine, tests/hardening/scripted_server.py) sharing their sessions in it, and HAProxy running
deploy/haproxy.cfg as it is. The replicas listen on 127.0.0.2 and 127.0.0.3 on one port, and
HAProxy finds them by DNS (dns.py), as it finds a scaled compose service through Docker's DNS.
With ``local=True``: deploy/haproxy-local.cfg, the replicas on 127.0.0.1 at two ports it names,
as docs/deploy.md runs them on one machine without Docker.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import hashlib
import os
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.deploy.dns import replica_dns
from tests.sessions.test_redis_replicas import RedisProcess, redis_server
from tests.support import ROOT, TIMEOUT, free_port, next_stats, server_process, stats_socket

HAPROXY = "/usr/sbin/haproxy"
CONFIG = ROOT / "deploy" / "haproxy.cfg"
LOCAL_CONFIG = ROOT / "deploy" / "haproxy-local.cfg"
REPLICA_NAME = "wschat-replica"
HOSTS = ("127.0.0.2", "127.0.0.3")
LEASE_S = 3.0
# a drain long enough to watch HAProxy take the replica out while a reply still runs
REPLICA_OPTIONS = ("--session-lease-s", str(LEASE_S), "--shutdown-grace-s", "30")


@dataclass(eq=False)
class Replica:
    process: subprocess.Popen[bytes]
    url: str  # ws://HOST:PORT/v1/chat, bypassing HAProxy

    @property
    def address(self) -> str:
        return self.url.removeprefix("ws://").removesuffix("/v1/chat")


@dataclass
class HAProxy:
    process: subprocess.Popen[bytes]
    port: int
    stats_port: int
    log: Path

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/chat"

    async def servers(self) -> dict[str, dict[str, str]]:
        """The backend's servers as its stats page says (``/stats;csv``), by address."""
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            text = (await http.get(f"http://127.0.0.1:{self.stats_port}/stats;csv")).text
        rows = csv.DictReader(text.removeprefix("# ").splitlines())
        return {
            row["addr"]: row
            for row in rows
            if row["pxname"] == "replicas" and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    async def wait_servers(self, wanted: Callable[[dict[str, dict[str, str]]], bool]) -> None:
        """Until the servers' states are as ``wanted`` says (health checks and DNS run on
        HAProxy's own clock: nothing to await but its stats)."""
        async with asyncio.timeout(TIMEOUT):
            while True:
                assert self.process.poll() is None, self.log.read_text()
                with contextlib.suppress(httpx.TransportError):  # not listening yet
                    if wanted(await self.servers()):
                        return
                await asyncio.sleep(0.1)


@dataclass
class Cluster:
    store: RedisProcess
    replicas: list[Replica]
    haproxy: HAProxy

    @property
    def url(self) -> str:
        """Where clients connect: HAProxy."""
        return self.haproxy.url

    def replica(self, url: str) -> Replica:
        (found,) = [r for r in self.replicas if r.url == url]
        return found


def status_is(status: str, *replicas: Replica) -> Callable[[dict[str, dict[str, str]]], bool]:
    def wanted(servers: dict[str, dict[str, str]]) -> bool:
        return all(servers.get(r.address, {}).get("status") == status for r in replicas)

    return wanted


def shared_port(hosts: Sequence[str]) -> int:
    """A port free on every one of ``hosts``."""
    while True:
        port = free_port()
        try:
            for host in hosts:
                with socket.socket() as sock:
                    sock.bind((host, port))
            return port
        except OSError:
            continue


def dns_settings(dns_port: int, replica_port: int) -> dict[str, str]:
    """deploy/haproxy.cfg's variables for replicas that ``dns_port`` lists, on one port."""
    return {
        "WSCHAT_REPLICAS": f"{REPLICA_NAME}:{replica_port}",
        "WSCHAT_REPLICA_SLOTS": "1-4",
        "WSCHAT_DNS": f"127.0.0.1:{dns_port}",
    }


@contextlib.asynccontextmanager
async def haproxy(
    config: Path, servers: Mapping[str, str], log: Path, settings: Mapping[str, str] | None = None
) -> AsyncIterator[HAProxy]:
    """HAProxy on ``config``; ``servers``: the variables that name the replicas, ``settings``:
    more of its ``WSCHAT_*`` variables."""
    port, stats_port = free_port(), free_port()
    env = {
        **os.environ,
        **(settings or {}),
        **servers,
        "WSCHAT_LISTEN": f"127.0.0.1:{port}",
        "WSCHAT_HAPROXY_STATS": f"127.0.0.1:{stats_port}",
    }
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [HAPROXY, "-db", "-f", str(config)], stdout=sink, stderr=sink, env=env
        )
    try:
        yield HAProxy(process, port, stats_port, log)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # HAProxy's hard stop
            try:
                process.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(TIMEOUT)


@contextlib.asynccontextmanager
async def cluster(
    tmp_path: Path, *options: str, proxy: Mapping[str, str] | None = None, local: bool = False
) -> AsyncIterator[Cluster]:
    """Redis, two replicas and HAProxy, once HAProxy has both replicas up; ``options``: more
    ``wschat-server`` options for the replicas, ``proxy``: HAProxy's ``WSCHAT_*`` variables;
    ``local``: deploy/haproxy-local.cfg, the replicas at two ports of 127.0.0.1."""
    async with redis_server(tmp_path) as store, contextlib.AsyncExitStack() as stack:
        if local:
            places = [("127.0.0.1", free_port()) for _ in HOSTS]
            config = LOCAL_CONFIG
            servers = {f"WSCHAT_REPLICA_{n}": f"{h}:{p}" for n, (h, p) in enumerate(places, 1)}
        else:
            port = shared_port(HOSTS)
            places = [(host, port) for host in HOSTS]
            _, dns_port = await stack.enter_async_context(replica_dns(REPLICA_NAME, list(HOSTS)))
            config, servers = CONFIG, dns_settings(dns_port, port)
        replicas = []
        for host, port in places:
            log = tmp_path / f"replica-{host}-{port}.log"
            every = ("--session-store", store.url, *REPLICA_OPTIONS, *options)
            started = server_process(log, *every, host=host, port=port)
            replicas.append(Replica(*await stack.enter_async_context(started)))
        started_proxy = haproxy(config, servers, tmp_path / "haproxy.log", proxy)
        balancer = await stack.enter_async_context(started_proxy)
        await balancer.wait_servers(status_is("UP", *replicas))
        yield Cluster(store, replicas, balancer)


def client_at(host: str) -> dict[str, Any]:
    """``websockets.connect`` options for a client connecting from ``host`` (a loopback address
    of its own, as distinct clients have distinct addresses)."""
    return {"local_addr": (host, 0)}


def live_id(session: str) -> str:
    """How ``/v1/stats`` names a session in its live table (PROTOCOL.md "Other endpoints")."""
    return hashlib.sha256(session.encode()).hexdigest()[:10]


async def holders(replicas: Sequence[Replica], sessions: Sequence[str]) -> dict[str, Replica]:
    """The replica each of ``sessions`` is connected to, as the replicas' ``/v1/stats`` live
    tables say. A snapshot may be a second old, so the first frame of each socket (sent at once)
    is skipped: the next ones are taken after the call."""
    wanted = {live_id(s): s for s in sessions}
    found: dict[str, Replica] = {}

    async def watch(replica: Replica) -> None:
        """Until every session is placed (by this watcher or another)."""
        async with stats_socket(replica.url) as ws:
            await next_stats(ws)
            while len(found) < len(wanted):
                for row in (await next_stats(ws)).live or ():
                    if row["id"] in wanted:
                        assert found.setdefault(wanted[row["id"]], replica) is replica

    watchers = [asyncio.create_task(watch(r)) for r in replicas]
    try:
        done, _ = await asyncio.wait(watchers, timeout=TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        assert done, f"not every session was found live within {TIMEOUT} s: {found}"
        for watcher in done:
            watcher.result()  # a watcher's failure is the test's
    finally:
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
    return found
