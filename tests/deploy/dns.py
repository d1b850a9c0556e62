"""``ReplicaDNS``: a loopback DNS server (UDP) that answers one name with the replicas' IPv4
addresses, as Docker's embedded DNS answers a scaled service's name; HAProxy's ``resolvers``
fill ``server-template`` slots from it. It answers A queries for that name and nothing else
(every other question gets an empty answer), which is all HAProxy asks."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator
from typing import cast

A, IN = 1, 1
TTL_S = 1


def question_end(packet: bytes) -> int:
    """Where the first question's name ends (its labels, uncompressed, as a query has them)."""
    at = 12
    while packet[at]:
        at += 1 + packet[at]
    return at + 1


def qname(packet: bytes) -> str:
    labels, at = [], 12
    while packet[at]:
        labels.append(packet[at + 1 : at + 1 + packet[at]].decode("ascii").lower())
        at += 1 + packet[at]
    return ".".join(labels)


class ReplicaDNS(asyncio.DatagramProtocol):
    def __init__(self, name: str, addresses: list[str]) -> None:
        self.name = name.lower()
        self.addresses = addresses  # a test may change them: the next answer says so
        self.transport: asyncio.DatagramTransport | None = None
        self.queries = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        assert self.transport is not None
        with contextlib.suppress(IndexError, struct.error, UnicodeDecodeError):
            self.transport.sendto(self.answer(data), addr)

    def answer(self, query: bytes) -> bytes:
        self.queries += 1
        (ident,) = struct.unpack("!H", query[:2])
        end = question_end(query)
        question = query[12 : end + 4]
        qtype, _ = struct.unpack("!HH", query[end : end + 4])
        found = self.addresses if qtype == A and qname(query) == self.name else []
        # QR, opcode 0, AA, RD copied as set; RA; rcode 0; one question, the answers, no others
        flags = 0x8400 | (struct.unpack("!H", query[2:4])[0] & 0x0100) | 0x0080
        header = struct.pack("!HHHHHH", ident, flags, 1, len(found), 0, 0)
        records = b"".join(
            struct.pack("!HHHIH", 0xC00C, A, IN, TTL_S, 4) + socket.inet_aton(address)
            for address in found
        )
        return header + question + records


@contextlib.asynccontextmanager
async def replica_dns(name: str, addresses: list[str]) -> AsyncIterator[tuple[ReplicaDNS, int]]:
    """The server on 127.0.0.1:<free UDP port>; yields it and its port."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_datagram_endpoint(
        lambda: ReplicaDNS(name, addresses), local_addr=("127.0.0.1", 0)
    )
    try:
        yield protocol, transport.get_extra_info("sockname")[1]
    finally:
        transport.close()
