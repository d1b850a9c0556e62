"""``python -m tests.hardening.http_door_figures bodies|lockout [wschat-server options]``: the
figures of two attacks on the HTTP door against the real ``serve`` on the scripted engine
(``scripted_server.py``) in a process of its own. Prints one line.

- ``bodies``: 30 connections from 127.0.0.1 each send a chat completion's head and its body but
  the last byte (12 MiB - 1), then nothing; 300 from 127.0.0.2 send a head and then a byte every
  5 s. The server's RSS before, at its highest and after 40 s, and how many of each are still
  open after 40 s.
- ``lockout``: 127.0.0.2-4 keep 90 silent connections each, each opened again as soon as the
  server drops it; 127.0.0.5 asks ``/healthz`` and opens a chat once a second, 29 times: how
  many got an answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
from pathlib import Path

import httpx

from tests.support import raw_peer, server_process

MIB = 1024 * 1024
WATCH_S = 40.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1000
    raise LookupError("no VmRSS")


def head(port: int, length: int) -> bytes:
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


async def connect(port: int, local: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    async with asyncio.timeout(10):
        return await asyncio.open_connection("127.0.0.1", port, local_addr=(local, 0))


async def open_for(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Whether the server still holds the connection ``seconds`` from now (what it sends is
    read and let go)."""
    try:
        async with asyncio.timeout(seconds):
            while await reader.read(65536):
                pass
            return False
    except ConnectionError:
        return False
    except TimeoutError:
        return True


async def bodies(port: int, pid: int) -> str:
    before = rss_mb(pid)
    highest = before
    streams = []
    for _ in range(30):
        with contextlib.suppress(OSError, TimeoutError):
            reader, writer = await connect(port, "127.0.0.1")
            writer.write(head(port, 12 * MIB) + b" " * (12 * MIB - 1))
            streams.append(("body", reader, writer))
    for _ in range(300):
        with contextlib.suppress(OSError, TimeoutError):
            reader, writer = await connect(port, "127.0.0.2")
            writer.write(head(port, 1000) + b"{")
            streams.append(("trickle", reader, writer))

    async def trickle() -> None:
        while True:
            await asyncio.sleep(5)
            for kind, _, writer in streams:
                if kind == "trickle" and not writer.is_closing():
                    with contextlib.suppress(OSError):
                        writer.write(b" ")

    async def watch() -> None:
        nonlocal highest
        while True:
            highest = max(highest, rss_mb(pid))
            await asyncio.sleep(0.5)

    background = [asyncio.create_task(trickle()), asyncio.create_task(watch())]
    still = await asyncio.gather(*(open_for(reader, WATCH_S) for _, reader, _ in streams))
    after = rss_mb(pid)
    for task in background:
        task.cancel()
    for _, _, writer in streams:
        writer.close()
    kinds = [kind for kind, _, _ in streams]
    held = {k: sum(s for s, kind in zip(still, kinds, strict=True) if kind == k) for k in kinds}
    return (
        f"bodies: RSS {before:.0f} MB, highest {highest:.0f} MB, after {WATCH_S:.0f} s"
        f" {after:.0f} MB; open after {WATCH_S:.0f} s: {held.get('body', 0)} of 30 bodies,"
        f" {held.get('trickle', 0)} of 300 trickles"
    )


async def lockout(port: int, url: str) -> str:
    async def keep_one(local: str) -> None:
        """A silent connection from ``local``, opened again as soon as the server drops it."""
        while True:
            with contextlib.suppress(OSError, TimeoutError):
                reader, writer = await connect(port, local)
                try:
                    await open_for(reader, 3600)
                finally:
                    writer.close()
            await asyncio.sleep(0.1)

    async def hold() -> None:
        await asyncio.gather(*(keep_one(f"127.0.0.{n}") for n in (2, 3, 4) for _ in range(90)))

    holding = asyncio.create_task(hold())
    await asyncio.sleep(2)  # the 270 are open
    health = chats = 0
    transport = httpx.AsyncHTTPTransport(local_address="127.0.0.5")
    async with httpx.AsyncClient(transport=transport, timeout=5) as http:
        for _ in range(29):
            with contextlib.suppress(httpx.HTTPError):
                health += (await http.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5), raw_peer(url, local_addr=("127.0.0.5", 0)) as (_, r):
                    chats += r["type"] == "ready"
            await asyncio.sleep(1)
    holding.cancel()
    await asyncio.gather(holding, return_exceptions=True)
    return f"lockout: a fourth address got {health} of 29 /healthz and {chats} of 29 chats"


async def main(case: str, options: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "server.log"
        async with server_process(log, *options) as (process, url):
            port = int(url.split(":")[2].split("/")[0])
            if case == "bodies":
                print(await bodies(port, process.pid))
            else:
                print(await lockout(port, url))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
