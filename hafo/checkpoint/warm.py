"""Warm survivors, the workload's side (docs/reference/checkpoint-sdk.md, "Warm survivors"; the
protocol with hafo's guard: ``hafo.model.warm``).

``run(train)`` joins the gang's process group and calls ``train`` once per epoch. When a
member of the gang is lost, hafo asks the survivors to park (``park.json`` in
``$HAFO_WARM_DIR``); each then leaves its process group, confirms (``parked.json``), waits for
the gang's next epoch (``epoch.json``: the environment variables that changed), sets them and
joins the next epoch's group, in the same process: the interpreter, the imports, the model
and the CUDA context are kept.

Unblocking a collective (torch 2.13): ``ProcessGroup.abort()``, ``shutdown()`` and
``distributed_c10d._abort_process_group()`` return at once for gloo but leave an all-reduce
blocked on a stopped peer waiting until the group's timeout. What ends it is shutting down the
TCP connections of the group (``socket.shutdown`` on the descriptors that
``init_process_group`` opened): the collective then raises "Connection closed by peer" within
milliseconds. The connections to the rendezvous store (``$MASTER_PORT``) and listening sockets
are left alone: gloo ends the process when its listener fails. For NCCL,
``_abort_process_group()`` aborts the communicators. Without either, the collective's
``timeout`` ends it. One race is left with gloo: when the peer shuts its side down first and
gloo closes this member's connection between two collectives, before this member's own abort,
the next collective waits for the group's ``timeout`` (about 1 park in 8 on two CPU ranks of
``scripts/gpu_warm_check.py --device cpu``): keep ``timeout`` short with gloo.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

from hafo.checkpoint.peer_link import abort_transfers
from hafo.model.warm import (
    EPOCH_FILE,
    PARK_FILE,
    PARKED_FILE,
    STANDBY_ENV,
    WARM_DIR_ENV,
    NextEpoch,
    Parked,
    ParkRequest,
    encode_parked,
    parse_next_epoch,
    parse_park,
)
from hafo.warm_files import read_protocol_file, write_protocol_file

log = logging.getLogger("hafo.checkpoint")

T = TypeVar("T")

#: How often ``park.json`` and ``epoch.json`` are looked at (a stat each), in seconds.
POLL_SECONDS = 0.025
#: The longest a parking member waits for its process group's teardown; past it the member
#: gives up and the error that ended its epoch is raised (hafo restarts the gang cold).
TEARDOWN_SECONDS = 5.0


class ParkRequested(Exception):
    """hafo asked this process to leave its epoch's process group (``WarmEpoch.check()``)."""


@dataclass(frozen=True)
class WarmEpoch:
    """The epoch ``train`` runs in: its ``rank`` of ``world_size``; ``generation`` counts the
    hand-overs this process had (0: its first epoch, a cold start; more: it is warm, its
    objects come from an earlier epoch)."""

    epoch: int
    rank: int
    world_size: int
    generation: int = 0
    _park: threading.Event = field(default_factory=threading.Event, repr=False,
                                   compare=False)

    @property
    def warm(self) -> bool:
        """Whether this process ran an earlier epoch (``generation > 0``)."""
        return self.generation > 0

    @property
    def parking(self) -> bool:
        """Whether hafo asked this process to park during this epoch."""
        return self._park.is_set()

    def check(self) -> None:
        """Raise ``ParkRequested`` if hafo asked this process to park: for a loop that stops
        between steps (its next collective would fail anyway)."""
        if self._park.is_set():
            raise ParkRequested(f"epoch {self.epoch}: hafo asked this process to park")


def default_backend() -> str:
    """``cpu:gloo,cuda:nccl`` where CUDA is present (NCCL for device tensors, gloo for a
    host tensor's collective), else ``gloo``."""
    import torch

    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def run(train: Callable[[WarmEpoch], T], *, backend: str | None = None,
        timeout: timedelta = timedelta(seconds=20), park_wait: float = 30.0,
        on_park: Callable[[Parked], None] | None = None) -> T:
    """Run ``train`` in the gang's process group (``env://``: ``MASTER_ADDR``,
    ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``) and return what it returns.

    Without ``$HAFO_WARM_DIR``: once; its exceptions propagate. With it: once per epoch. When
    ``train`` raises and hafo asks this process to park (before, or within ``park_wait``
    seconds after), it parks: tears down the process group (at most ``TEARDOWN_SECONDS``),
    calls ``on_park``, writes ``parked.json`` and waits for the next epoch, sets the variables
    handed over and calls ``train`` again. Otherwise the exception propagates. ``backend``
    defaults to ``default_backend()``, ``timeout`` is the group's (collectives, rendezvous).
    """
    import torch.distributed as dist

    chosen = backend or default_backend()
    directory = os.environ.get(WARM_DIR_ENV)
    if not directory:
        dist.init_process_group(chosen, timeout=timeout)
        value = train(WarmEpoch(_env_int("HAFO_EPOCH", 0), _env_int("RANK", 0),
                                _env_int("WORLD_SIZE", 1)))
        dist.destroy_process_group()
        return value
    member = _Member(Path(directory), chosen, timeout, park_wait, on_park)
    return member.run(train)


class _Member:
    """One warm process: its epochs, and the thread that watches for a park request."""

    def __init__(self, directory: Path, backend: str, timeout: timedelta, park_wait: float,
                 on_park: Callable[[Parked], None] | None) -> None:
        self.dir = directory
        self.backend = backend
        self.timeout = timeout
        self.park_wait = park_wait
        self.on_park = on_park
        self.lock = threading.Lock()  # the epoch's fields below, between the two threads
        self.epoch = -1
        self.park = threading.Event()
        self.requested_at: float | None = None
        self.links: frozenset[int] | None = None  # the group's sockets; None: no group
        self.store_port = 0
        self.aborted = False
        self.stopped = threading.Event()

    def run(self, train: Callable[[WarmEpoch], T]) -> T:
        watcher = threading.Thread(target=self._watch, name="hafo-warm-watch", daemon=True)
        watcher.start()
        try:
            generation = 0
            while True:
                if os.environ.get(STANDBY_ENV) == "1":
                    self._stand_by()  # a warm gang's standby: no rank until handed one
                    generation += 1
                    continue
                returned = self._epoch(train, generation)
                if returned is not None:
                    return returned[0]
                generation += 1
        finally:
            self.stopped.set()

    def _epoch(self, train: Callable[[WarmEpoch], T], generation: int) -> tuple[T] | None:
        """One epoch: (train's value,) when it returned; None once parked and handed the
        next epoch; raises what ended it otherwise."""
        import torch.distributed as dist

        epoch = _env_int("HAFO_EPOCH", 0)
        with self.lock:
            self.epoch, self.park, self.requested_at = epoch, threading.Event(), None
            self.links, self.aborted = None, False
            self.store_port = _env_int("MASTER_PORT", 0)
        current = WarmEpoch(epoch, _env_int("RANK", 0), _env_int("WORLD_SIZE", 1), generation,
                            self.park)
        started = time.monotonic()
        try:
            before = _socket_inodes()
            dist.init_process_group(self.backend, timeout=self.timeout)
            with self.lock:
                self.links = frozenset(_socket_inodes().keys() - before.keys())
                if self.park.is_set():
                    self._abort()  # asked while it was joining
            log.info("epoch %d: rank %d of %d joined in %.3fs (generation %d)", epoch,
                     current.rank, current.world_size, time.monotonic() - started, generation)
            current.check()
            value = train(current)
        except Exception as exc:
            error: Exception = exc
        else:
            with self.lock:
                self.links = None
                aborted = self.aborted
            if aborted:
                # its group was aborted under it (a park request): what it returned may rest
                # on collectives that never completed (NCCL's abort fails none of them), so
                # it is no result: park, and run the next epoch as asked
                error = ParkRequested(f"epoch {epoch}: train returned after its process "
                                      "group was aborted")
            else:
                if dist.is_initialized():
                    dist.destroy_process_group()
                return (value,)
        self._park(error, epoch)
        return None

    # -- parking ----------------------------------------------------------------------------

    def _park(self, error: Exception, epoch: int) -> None:
        """Park after ``error`` ended ``epoch`` and wait for the next epoch; raise ``error``
        if no park request comes within ``park_wait`` or the teardown blocks."""
        failed = time.monotonic()
        if not self.park.wait(self.park_wait):
            log.warning("epoch %d: %s: %s; no park request within %gs, not parking", epoch,
                        type(error).__name__, error, self.park_wait)
            raise error
        log.info("epoch %d: parking after %s: %s", epoch, type(error).__name__,
                 str(error)[:300])
        # The frames of train hold what holds the group (a DDP wrapper): let them go.
        traceback.clear_frames(error.__traceback__)
        with self.lock:
            self._abort()
            links, self.links = self.links or frozenset(), None
        torn = time.monotonic()
        if not _teardown(TEARDOWN_SECONDS):
            log.error("epoch %d: the process group's teardown blocked for %gs: not parking",
                      epoch, TEARDOWN_SECONDS)
            raise error
        gc.collect()
        left = _shutdown_links(links, store_port=None)
        if left:
            log.warning("epoch %d: %d connections of the process group were still open after "
                        "its teardown (something keeps a reference to it): shut down", epoch,
                        left)
        parked = Parked(epoch, os.getpid(), time.time())
        if self.on_park is not None:  # before the confirmation: the next epoch follows it
            try:
                self.on_park(parked)
            except Exception:
                log.exception("epoch %d: on_park failed", epoch)
        try:
            write_protocol_file(self.dir / PARKED_FILE, encode_parked(parked))
            written = True
        except OSError as exc:
            log.error("epoch %d: %s not written, not parking: %s", epoch, PARKED_FILE, exc)
            written = False
        if not written:
            raise error
        now = time.monotonic()
        requested = self.requested_at if self.requested_at is not None else now
        log.info("epoch %d: parked %.3fs after the failure, %.3fs after the request "
                 "(teardown %.3fs)", epoch, now - failed, now - requested, now - torn)
        self._take_next_epoch(epoch, now)

    def _stand_by(self) -> None:
        """A standby (``$HAFO_WARM_STANDBY``): park at once, with no process group, when its
        guard asks (at its start), and take the epoch it is handed: a member's (its rank,
        the gang's rendezvous), or a standby's again."""
        epoch = _env_int("HAFO_EPOCH", 0)
        with self.lock:
            self.epoch, self.park, self.requested_at = epoch, threading.Event(), None
            self.links, self.aborted = None, False
        self.park.wait()
        confirm_park(self.dir, epoch)
        log.info("epoch %d: standing by", epoch)
        self._take_next_epoch(epoch, time.monotonic())

    def _take_next_epoch(self, epoch: int, since: float) -> None:
        """Wait for the hand-over of an epoch after ``epoch`` and set its variables."""
        now = since
        handed = take_next_epoch(self.dir, epoch)
        log.info("epoch %d: handed epoch %d after %.3fs parked (%s)", epoch, handed.epoch,
                 time.monotonic() - now, ", ".join(sorted(handed.env)) or "no variables")

    def _abort(self) -> None:
        """Make the group's collectives fail now (under ``lock``; once per epoch)."""
        if self.links is None or self.aborted:
            return
        self.aborted = True
        started = time.monotonic()
        abort_transfers()  # a snapshot's copy to a stopped peer would block the heartbeat
        if "gloo" in self.backend:
            _shutdown_links(self.links, store_port=self.store_port)
        if self.backend != "gloo":
            import torch.distributed as dist

            try:
                dist.distributed_c10d._abort_process_group()
            except Exception as exc:  # already destroyed, or a backend without abort
                log.warning("epoch %d: abort of the process group: %s", self.epoch, exc)
        log.info("epoch %d: process group aborted in %.3fs", self.epoch,
                 time.monotonic() - started)

    # -- the watcher ------------------------------------------------------------------------

    def _watch(self) -> None:
        """Poll ``park.json``; on a request for this epoch or a later one, flag it and abort
        the group."""
        reader = _Reader(self.dir / PARK_FILE, parse_park)
        while not self.stopped.wait(POLL_SECONDS):
            request = reader.read()
            if isinstance(request, ParkRequest):
                self._requested(request)

    def _requested(self, request: ParkRequest) -> None:
        with self.lock:
            if request.epoch < self.epoch or self.park.is_set():
                return
            self.requested_at = time.monotonic()
            self.park.set()
            log.info("epoch %d: park requested (for epoch %d)", self.epoch, request.epoch)
            try:
                self._abort()
            except Exception:
                log.exception("epoch %d: abort failed", self.epoch)


class _Reader:
    """A protocol file read again only when it changed (its inode, mtime or size)."""

    def __init__(self, path: Path, parse: Callable[[str], object | None]) -> None:
        self.path = path
        self.parse = parse
        self.seen: tuple[int, int, int] | None = None
        self.value: object | None = None

    def read(self) -> object | None:
        try:
            st = os.stat(self.path)
        except OSError:
            self.seen = self.value = None
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self.seen:
            return self.value
        self.seen, self.value = key, None
        text = read_protocol_file(self.path)
        if text is not None:
            self.value = self.parse(text)
            if self.value is None:
                log.warning("%s ignored: not a valid %s", self.path, self.path.name)
        return self.value


def park_requested(directory: Path, epoch: int) -> bool:
    """Whether the guard asked the process of ``epoch`` (or a later one) to park: for a
    workload that speaks the protocol without ``run`` (no torch; ``hafo.local.workload``)."""
    text = read_protocol_file(directory / PARK_FILE)
    request = parse_park(text) if text is not None else None
    return request is not None and request.epoch >= epoch


def confirm_park(directory: Path, epoch: int) -> Parked:
    """Tell the guard that this process left ``epoch`` (it holds no link to any of its
    ranks): ``parked.json``."""
    parked = Parked(epoch, os.getpid(), time.time())
    write_protocol_file(directory / PARKED_FILE, encode_parked(parked))
    return parked


def take_next_epoch(directory: Path, epoch: int) -> NextEpoch:
    """Wait (no limit) for the hand-over of an epoch after ``epoch``, then set the variables
    it names in ``os.environ`` (an empty value unsets one) and ``HAFO_EPOCH``."""
    handed = _wait_next_epoch(directory / EPOCH_FILE, epoch)
    for name, value in handed.env.items():
        if value:
            os.environ[name] = value
        else:
            os.environ.pop(name, None)
    os.environ["HAFO_EPOCH"] = str(handed.epoch)
    return handed


def _wait_next_epoch(path: Path, epoch: int) -> NextEpoch:
    """Wait (no limit) for a hand-over of an epoch after ``epoch``."""
    reader = _Reader(path, parse_next_epoch)
    ignored: object | None = None
    while True:
        handed = reader.read()
        if isinstance(handed, NextEpoch):
            if handed.epoch > epoch:
                return handed
            if handed is not ignored:
                ignored = handed
                log.info("%s ignored: epoch %d is not after %d", path, handed.epoch, epoch)
        time.sleep(POLL_SECONDS)


def _teardown(limit: float) -> bool:
    """Destroy the default process group in a thread; False if it took over ``limit``."""
    import torch.distributed as dist

    done = threading.Event()

    def destroy() -> None:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception as exc:  # an aborted group is gone already
            log.warning("destroy_process_group: %s", exc)
        finally:
            done.set()

    threading.Thread(target=destroy, name="hafo-warm-teardown", daemon=True).start()
    return done.wait(limit)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    return int(raw) if raw.strip() else default


def _socket_inodes() -> dict[int, int]:
    """This process's sockets: inode -> a descriptor of it (Linux; empty elsewhere)."""
    found: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError, ValueError):
                link = os.readlink(f"/proc/self/fd/{name}")
                if link.startswith("socket:["):
                    found.setdefault(int(link[8:-1]), int(name))
    return found


def _shutdown_links(inodes: frozenset[int], store_port: int | None) -> int:
    """Shut down the connected TCP sockets among ``inodes`` (a blocked recv on one returns
    an error), except those to or from ``store_port``; listening sockets are left alone.
    Returns how many were shut down."""
    count = 0
    for inode, fd in _socket_inodes().items():
        if inode not in inodes:
            continue
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with sock:
            try:
                if sock.family not in (socket.AF_INET, socket.AF_INET6):
                    continue
                local, peer = sock.getsockname()[1], sock.getpeername()[1]
            except OSError:  # a listener, or not connected
                continue
            if store_port is not None and store_port in (local, peer):
                continue
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
                count += 1
    return count
