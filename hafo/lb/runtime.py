"""An async client of HAProxy's runtime API (the stats socket: "Runtime API" in HAProxy's
management guide), enough to drive a backend's server slots.

One command per connection, in non-interactive mode: HAProxy answers and closes, so nothing
is left half-read after a timeout or a reload. On a unix socket a connection costs well
under a millisecond. The socket needs ``level admin`` to change servers (``level operator``
answers "Permission denied").

Commands: ``show servers state BACKEND``, ``set server BACKEND/SLOT addr A port P`` and
``set server BACKEND/SLOT state ready|drain|maint``. Every reply is checked: one that is not
what the command answers on success raises ``HaproxyRefused`` with a one-line explanation.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from hafo.lb.slots import LbError, SlotChange, SlotMode, SlotState, parse_servers_state

__all__ = ["HaproxyRefused", "HaproxyUnreachable", "RuntimeApi", "SocketAddress",
           "parse_socket"]

#: Backend and server names HAProxy accepts (and nothing that could end a command).
_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
_HOSTPORT = re.compile(r"(?:ipv4@|ipv6@)?\[?([^\[\]@/]+?)\]?:(\d{1,5})")
# A successful "set server ... addr" answers "IP changed from ..." or "no need to change the
# addr, ..."; a successful "set server ... state" answers nothing.
_ADDR_DONE = re.compile(r"(IP changed from|no need to change the addr)")
_MAX_REPLY = 4 << 20


class HaproxyUnreachable(LbError):
    """The runtime API does not answer (no socket, connection refused, timeout)."""


class HaproxyRefused(LbError):
    """HAProxy answered a command with an error (no such backend or server, permission
    denied, an invalid address)."""


@dataclass(frozen=True, slots=True)
class SocketAddress:
    """Where the runtime API listens: a unix socket ``path``, or TCP ``host``:``port``."""

    path: str | None = None
    host: str | None = None
    port: int = 0

    def __str__(self) -> str:
        return self.path if self.path is not None else f"{self.host}:{self.port}"


def parse_socket(address: str) -> SocketAddress:
    """``/run/haproxy/admin.sock`` or ``unix@PATH`` (a unix socket), ``HOST:PORT``,
    ``ipv4@HOST:PORT`` or ``ipv6@[HOST]:PORT`` (TCP, as in a ``stats socket`` line)."""
    if address.startswith("unix@"):
        address = address.removeprefix("unix@")
        if not address:
            raise LbError("empty unix socket path")
        return SocketAddress(path=address)
    tcp = _HOSTPORT.fullmatch(address)
    if tcp is not None and "/" not in address:
        port = int(tcp.group(2))
        if not 0 < port < 65536:
            raise LbError(f"invalid port in runtime API address {address!r}")
        return SocketAddress(host=tcp.group(1), port=port)
    if address.startswith(("ipv4@", "ipv6@")) or not address:
        raise LbError(f"invalid runtime API address {address!r} (want a socket path, "
                      "HOST:PORT or ipv4@HOST:PORT)")
    return SocketAddress(path=address)


def check_name(name: str, what: str) -> str:
    """``name`` if HAProxy could call a backend or server that (LbError otherwise)."""
    if not _NAME.fullmatch(name):
        raise LbError(f"invalid {what} name {name!r}")
    return name


class RuntimeApi:
    """HAProxy's runtime API at ``address`` (see ``parse_socket``)."""

    def __init__(self, address: str, timeout: float = 2.0) -> None:
        self.address = parse_socket(address)
        self.timeout = timeout
        self.sent = 0  # commands sent, for tests and logs

    async def command(self, line: str) -> str:
        """Send one command, return HAProxy's whole reply (HaproxyUnreachable if it cannot
        be had within the timeout)."""
        if "\n" in line or ";" in line:
            raise LbError(f"refusing to send {line!r}: one command at a time")
        try:
            async with asyncio.timeout(self.timeout):
                return await self._exchange(line)
        except TimeoutError:
            raise HaproxyUnreachable(f"haproxy's runtime API at {self.address} did not answer "
                                     f"{line!r} within {self.timeout:g}s") from None
        except OSError as exc:
            raise HaproxyUnreachable(f"haproxy's runtime API at {self.address}: "
                                     f"{exc.strerror or exc}") from None

    async def _exchange(self, line: str) -> str:
        if self.address.path is not None:
            reader, writer = await asyncio.open_unix_connection(self.address.path)
        else:
            reader, writer = await asyncio.open_connection(self.address.host,
                                                           self.address.port)
        try:
            writer.write(line.encode() + b"\n")
            await writer.drain()
            self.sent += 1
            return await _read_all(reader)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def servers_state(self, backend: str) -> list[SlotState]:
        """The backend's servers as HAProxy has them now (``show servers state``)."""
        reply = await self.command(f"show servers state {check_name(backend, 'backend')}")
        if not reply.startswith("1\n"):
            raise _refused(reply, f"show servers state {backend}", backend)
        slots = parse_servers_state(reply, backend)
        if not slots:
            raise HaproxyRefused(f"haproxy's backend {backend!r} has no servers: give it "
                                 "slots, e.g. 'server-template srv 1-8 127.0.0.1:1 disabled'")
        return slots

    async def set_address(self, backend: str, slot: str, address: str, port: int) -> None:
        """Point a server at ``address``:``port`` (an IP address: HAProxy 2.6 refuses
        names here)."""
        line = (f"set server {check_name(backend, 'backend')}/{check_name(slot, 'server')} "
                f"addr {check_name(address, 'address')} port {int(port)}")
        reply = await self.command(line)
        if not _ADDR_DONE.match(reply):
            raise _refused(reply, line, backend, slot)

    async def set_mode(self, backend: str, slot: str, mode: SlotMode) -> None:
        """Set a server's administrative state."""
        line = (f"set server {check_name(backend, 'backend')}/{check_name(slot, 'server')} "
                f"state {mode}")
        reply = await self.command(line)
        if reply.strip():
            raise _refused(reply, line, backend, slot)

    async def apply(self, backend: str, changes: Sequence[SlotChange]) -> int:
        """Send the commands of ``changes``, in order; returns how many were sent."""
        sent = 0
        for change in changes:
            for step in change.steps():
                if step == "addr":
                    await self.set_address(backend, change.slot, change.after.address,
                                           change.after.port)
                else:
                    await self.set_mode(backend, change.slot, change.after.mode)
                sent += 1
        return sent


async def _read_all(reader: asyncio.StreamReader) -> str:
    """The reply: everything until HAProxy closes the connection (at most 4 MiB)."""
    chunks: list[bytes] = []
    size = 0
    while size < _MAX_REPLY and (chunk := await reader.read(65536)):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks).decode(errors="replace")


def _refused(reply: str, line: str, backend: str, slot: str | None = None) -> HaproxyRefused:
    """The error for HAProxy's answer ``reply`` to ``line``, in one line."""
    first = next((x.strip() for x in reply.splitlines() if x.strip()), "")
    if first in ("No such backend.", "Can't find backend."):
        return HaproxyRefused(f"haproxy has no backend {backend!r}")
    if first == "No such server." and slot is not None:
        return HaproxyRefused(f"haproxy's backend {backend!r} has no server {slot!r}")
    if first == "Permission denied":
        return HaproxyRefused(f"haproxy refused {line!r}: permission denied (the stats "
                              "socket needs 'level admin')")
    if first.startswith("Unknown command"):
        return HaproxyRefused(f"haproxy does not know {line!r}")
    return HaproxyRefused(f"haproxy refused {line!r}: {first[:200] or 'empty reply'}")
