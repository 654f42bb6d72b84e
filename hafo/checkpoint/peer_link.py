"""Snapshots between gang members' nodes over TCP: a member sends its newest snapshot to
its peer (``put``), and a member that lost its node's RAM fetches its own back (``get``).

Every member runs one ``PeerServer`` (a thread of its process) on its node's address. A
request is one frame: 4 bytes (big-endian length) of JSON; the answer is one frame, then the
files' bytes for a ``get``. A ``put`` waits for the first answer (taken, or refused and why)
before it sends the files' bytes, and a second answer says they are stored. Requests carry
the server's token (published with its address in the gang's shared directory: only who can
read the checkpoints can talk to it). A ``put`` is refused unless its epoch is the server's own: a
member of an older epoch (a zombie on a cut-off node) cannot place a late snapshot into the
RAM the next epoch restores from. Sizes are checked against the free memory before a byte
is stored; a received copy is committed by a rename, like any checkpoint, and verified
(CRC-32C of every chunk) when it is read.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import shutil
import socket
import socketserver
import struct
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hafo.checkpoint.format import MANIFEST
from hafo.checkpoint.memory_store import FILES, PEER, MemoryStore

log = logging.getLogger("hafo.checkpoint")

MAX_FRAME = 64 * 1024  # a request or answer header
MAX_MANIFEST = 64 * 1024 * 1024
IO_TIMEOUT = 30.0
#: Connections served at once by one member's server (more are closed at once).
MAX_CONNECTIONS = 16
MAX_RANK = 99999  # rank directories have 5 digits
#: Kept free in the memory filesystem by a ``put`` (the node's RAM is also its workloads').
RESERVE_BYTES = 64 * 1024 * 1024
_LEN = struct.Struct(">I")


class PeerError(Exception):
    """A peer refused a request, or could not be reached."""


@dataclass(frozen=True)
class Endpoint:
    """Where one member's server listens, and the token it wants."""

    host: str
    port: int
    token: str


def _send_frame(sock: socket.socket, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise PeerError("connection closed early")
        got += n
    return bytes(buffer)


def _recv_frame(sock: socket.socket) -> dict[str, Any]:
    (size,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if size > MAX_FRAME:
        raise PeerError(f"frame of {size} bytes (at most {MAX_FRAME})")
    try:
        body = json.loads(_recv_exact(sock, size))
    except ValueError as exc:
        raise PeerError(f"bad frame: {exc}") from exc
    if not isinstance(body, dict):
        raise PeerError("bad frame: not an object")
    return body


def _recv_to_file(sock: socket.socket, path: Path, size: int) -> None:
    """``size`` bytes from ``sock`` into the file at ``path``, overwritten in place (an
    existing file's memory is reused), cut to ``size``."""
    chunk = bytearray(min(max(size, 1), 4 * 1024 * 1024))
    view = memoryview(chunk)
    left = size
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb", buffering=0) as fh:
        fh.truncate(size)
        while left:
            n = sock.recv_into(view[:min(left, len(chunk))])
            if n == 0:
                raise PeerError("connection closed early")
            fh.write(view[:n])
            left -= n


def _send_file(sock: socket.socket, path: Path) -> None:
    with open(path, "rb") as fh:
        sock.sendfile(fh)


def _sizes(raw: Any) -> list[int]:
    if not isinstance(raw, list) or len(raw) != len(FILES):
        raise PeerError(f"sizes must list {len(FILES)} numbers")
    sizes = [int(x) for x in raw]
    if any(x < 0 for x in sizes) or sizes[0] > MAX_MANIFEST:
        raise PeerError(f"bad sizes {sizes}")
    return sizes


def _size_of(path: Path) -> int:
    """The bytes of a snapshot's files (0 for what cannot be read)."""
    total = 0
    for name in FILES:
        with contextlib.suppress(OSError):
            total += (path / name).stat().st_size
    return total


def receive_snapshot(sock: socket.socket, store: MemoryStore, place: str, rank: int,
                     epoch: int, step: int, sizes: Sequence[int],
                     go: Callable[[], None] | None = None) -> Path:
    """Read one snapshot's files from ``sock`` into ``store`` and commit it by a rename;
    PeerError if the memory filesystem has not room for it. ``go`` is called once there is
    room, before the first byte is read (a ``put`` tells its sender to send)."""
    base = store.rank_root(place, rank)
    base.mkdir(parents=True, exist_ok=True)
    oldest = store.recyclable(place, rank)  # written over: its memory is reused
    reused = _size_of(oldest.path) if oldest is not None else 0
    free = shutil.disk_usage(base).free
    if sum(sizes) - reused + RESERVE_BYTES > free:
        raise PeerError(f"no room: {sum(sizes)} bytes offered, {free} free in {base}")
    if go is not None:
        go()
    tmp = base / f".recv-{uuid.uuid4().hex}"
    try:
        if oldest is None:
            raise FileNotFoundError(oldest)
        os.rename(oldest.path, tmp)
    except OSError:  # none to reuse, or gone meanwhile
        tmp.mkdir()
    try:
        for name, size in zip(FILES, sizes, strict=True):
            _recv_to_file(sock, tmp / name, size)
        final = store.path(place, rank, epoch, step)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    store.keep_newest(place, rank)
    return final


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        owner = self.server.owner
        if not owner.slots.acquire(blocking=False):
            log.warning("peer request refused: %d connections already", MAX_CONNECTIONS)
            return  # the connection closes
        try:
            self._serve(owner)
        finally:
            owner.slots.release()

    def _serve(self, owner: PeerServer) -> None:
        sock: socket.socket = self.request
        sock.settimeout(IO_TIMEOUT)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            request = _recv_frame(sock)
            if not hmac.compare_digest(str(request.get("token", "")), owner.token):
                raise PeerError("wrong token")
            op = request.get("op")
            rank, epoch, step = (int(request["rank"]), int(request["epoch"]),
                                 int(request["step"]))
            if min(rank, epoch, step) < 0 or rank > MAX_RANK:
                raise PeerError(f"bad rank {rank}, epoch {epoch} or step {step}")
            if op == "put":
                if epoch != owner.epoch:  # the fence: only this epoch's members place copies
                    raise PeerError(f"snapshot of epoch {epoch} refused: this member is of "
                                    f"epoch {owner.epoch}")
                sizes = _sizes(request.get("sizes"))
                with owner.put_lock:
                    receive_snapshot(sock, owner.store, PEER, rank, epoch, step, sizes,
                                     go=lambda: _send_frame(sock, {"ok": True}))
                _send_frame(sock, {"ok": True})
            elif op == "get":
                ref = owner.store.find(rank, epoch, step)
                if ref is None:
                    raise PeerError(f"no snapshot of rank {rank} epoch {epoch} step {step}")
                files = [ref.path / name for name in FILES]
                _send_frame(sock, {"ok": True, "sizes": [f.stat().st_size for f in files]})
                for path in files:
                    _send_file(sock, path)
            else:
                raise PeerError(f"unknown op {op!r}")
        except (PeerError, OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("peer request refused: %s", exc)
            with contextlib.suppress(OSError):
                _send_frame(sock, {"ok": False, "error": str(exc)[:500]})


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: PeerServer


class _Server6(_Server):
    address_family = socket.AF_INET6


class PeerServer:
    """One member's server: takes its peer's snapshots, hands out what this node holds."""

    def __init__(self, store: MemoryStore, epoch: int, host: str) -> None:
        self.store = store
        self.epoch = epoch
        self.token = uuid.uuid4().hex
        self.put_lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        server_class = _Server6 if ":" in host else _Server
        self._server = server_class((host, 0), _Handler)
        self._server.owner = self
        self.endpoint = Endpoint(host, int(self._server.server_address[1]), self.token)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        name="hafo-peer-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()


def _connect(endpoint: Endpoint, timeout: float) -> socket.socket:
    try:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small frames go at once
        return sock
    except OSError as exc:
        raise PeerError(f"{endpoint.host}:{endpoint.port}: {exc}") from exc


_transfers: set[socket.socket] = set()  # this process's transfers in flight
_transfers_lock = threading.Lock()


@contextlib.contextmanager
def _transfer(endpoint: Endpoint, timeout: float) -> Iterator[socket.socket]:
    """A connection for one transfer, known to ``abort_transfers`` while it is open."""
    sock = _connect(endpoint, timeout)
    with _transfers_lock:
        _transfers.add(sock)
    try:
        with sock:
            yield sock
    finally:
        with _transfers_lock:
            _transfers.discard(sock)


def abort_transfers() -> int:
    """Shut down every transfer this process has in flight (a warm member parking,
    ``hafo.checkpoint.warm``): one blocked on a stopped or unreachable peer fails at once
    instead of after its timeout. Returns how many were shut down."""
    with _transfers_lock:
        open_now = list(_transfers)
    for sock in open_now:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    return len(open_now)


def _answer(sock: socket.socket, endpoint: Endpoint) -> dict[str, Any]:
    answer = _recv_frame(sock)
    if not answer.get("ok"):
        raise PeerError(f"{endpoint.host}:{endpoint.port}: {answer.get('error')}")
    return answer


def put_snapshot(endpoint: Endpoint, rank: int, epoch: int, step: int, path: Path,
                 timeout: float = IO_TIMEOUT) -> None:
    """Send the snapshot at ``path`` (rank ``rank``'s, of ``epoch`` and ``step``) to a
    peer's server; PeerError if it is refused or not reached."""
    files = [path / name for name in FILES]
    try:
        sizes = [f.stat().st_size for f in files]
        with _transfer(endpoint, timeout) as sock:
            _send_frame(sock, {"op": "put", "token": endpoint.token, "rank": rank,
                               "epoch": epoch, "step": step, "sizes": sizes})
            _answer(sock, endpoint)  # taken: no byte is sent to be refused
            for file in files:
                _send_file(sock, file)
            _answer(sock, endpoint)
    except OSError as exc:
        raise PeerError(f"{endpoint.host}:{endpoint.port}: {exc}") from exc


def get_snapshot(endpoint: Endpoint, store: MemoryStore, place: str, rank: int, epoch: int,
                 step: int, timeout: float = IO_TIMEOUT) -> Path:
    """Fetch rank ``rank``'s snapshot of ``epoch`` and ``step`` from a peer's server into
    ``store`` (in ``place``); its path. PeerError if the peer has it not or is not reached."""
    try:
        with _transfer(endpoint, timeout) as sock:
            _send_frame(sock, {"op": "get", "token": endpoint.token, "rank": rank,
                               "epoch": epoch, "step": step})
            answer = _answer(sock, endpoint)
            path = receive_snapshot(sock, store, place, rank, epoch, step,
                                    _sizes(answer.get("sizes")))
    except OSError as exc:
        raise PeerError(f"{endpoint.host}:{endpoint.port}: {exc}") from exc
    if not (path / MANIFEST).is_file():
        raise PeerError(f"{path}: no manifest after the transfer")
    return path
