"""Which running instance of this node made no progress for its ``hang_timeout``
(docs/reference/workloads.md, "Hang detection"): the reading and the timing; the verdicts
are ``hafo.decisions.hangs``' (``oldest_stall``, ``slowest_pace``).

Every rank of an instance writes its heartbeat into the instance's progress directory
(``$HAFO_PROGRESS_DIR``, ``hafo.model.progress``). The agent reads them every supervise cycle
(0.2 s) and times each rank's last *change* on its own monotonic clock, as the ``progress``
check does: the heartbeat's wall-clock ``t`` only says whether it changed, so neither a step
of the machine's clock nor another node's clock enters the decision (docs/safety.md, "One
clock per decision").

For ``straggler_lag``, the SDK's heartbeats also carry each rank's own time per step (outside
its collectives); the agent reports the slowest rank's (``Pace``), again only when it moved by
a quarter of the lag, so a steady job writes nothing.

An instance is stalled once its oldest rank's progress is ``hang_timeout`` old, or, while no
rank has reported any, once it has run that long (the controller judges a gang only once some
member reported progress, ``InstanceStatus.progressed``: start-up is not a hang). The report
names that rank, its last step and whether its process is stopped; it stays the same object
while the stall lasts, so the agent writes its status once per stall, not once per cycle.

Reading ``/proc/<pid>`` of the rank named in a heartbeat only reads: nothing here signals a
process, and a pid is taken as the rank's only while its environment names this instance.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from hafo.agent.instances import InstanceKey
from hafo.agent.proctree import process_stopped
from hafo.decisions.hangs import RankProgress, oldest_stall, slowest_pace
from hafo.model.cluster import Pace, Restore, RestoreTier, Stall
from hafo.model.progress import (
    MAX_RANK_FILES,
    Heartbeat,
    parse_heartbeat,
    parse_restore,
    rank_of_file,
    restore_rank_of_file,
)

#: How long after an instance is first watched its restore report is looked for (the SDK's
#: restore comes before training; it waits at most 120 s for the gang's other members by
#: default): a workload that writes none costs no directory scan per cycle after that.
RESTORE_WINDOW_SECONDS = 600.0
#: How long a node's restore reports are read again after the first (its other ranks').
RESTORE_READ_SECONDS = 30.0
#: The most bytes read of one rank file (a heartbeat is under 100).
RANK_FILE_READ_LIMIT = 4096


def read_small_file(path: str) -> str | None:
    """At most ``RANK_FILE_READ_LIMIT`` bytes of the regular file at ``path``, or None: the
    workload writes this directory, so a link is not followed and a FIFO or a device is not
    read (opening a FIFO would block the agent's loop until a writer came)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, RANK_FILE_READ_LIMIT).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def read_beats(directory: Path) -> dict[int, Heartbeat]:
    """Every rank's heartbeat in ``directory`` (at most ``MAX_RANK_FILES``; files that are not
    rank files, or not heartbeats, are skipped; a missing directory has none)."""
    beats: dict[int, Heartbeat] = {}
    try:
        entries = os.scandir(directory)
    except OSError:
        return beats
    with entries:
        for entry in entries:
            rank = rank_of_file(entry.name)
            if rank is None:
                continue
            text = read_small_file(entry.path)
            beat = parse_heartbeat(text) if text is not None else None
            if beat is not None:
                beats[rank] = beat
            if len(beats) >= MAX_RANK_FILES:
                break
    return beats


def read_restored(directory: Path) -> Restore | None:
    """The restore report of the slowest rank in ``directory`` (the SDK's
    ``restore-<rank>.json``; at most ``MAX_RANK_FILES`` read), or None when there is none."""
    slowest: Restore | None = None
    try:
        entries = os.scandir(directory)
    except OSError:
        return None
    with entries:
        read = 0
        for entry in entries:
            if restore_rank_of_file(entry.name) is None:
                continue
            read += 1
            text = read_small_file(entry.path)
            parsed = parse_restore(text) if text is not None else None
            if parsed is not None:
                rank, tier, step, seconds = parsed
                found = Restore(rank, cast(RestoreTier, tier), step, seconds)
                if slowest is None or found.seconds > slowest.seconds:
                    slowest = found
            if read >= MAX_RANK_FILES:
                break
    return slowest


@dataclass
class _Watched:
    first_seen: float
    ranks: dict[int, RankProgress] = field(default_factory=dict)
    reported: Stall | None = None
    pace: Pace | None = None
    restored: Restore | None = None
    restored_seen: float | None = None  # when a report was first read
    restore_final: bool = False  # read again no more: every rank restored before its steps


class ProgressWatch:
    """The progress of this node's running instances, for ``hang_timeout``."""

    def __init__(self, node: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self.clock = clock
        self._watched: dict[InstanceKey, _Watched] = {}

    def stall(self, key: InstanceKey, directory: Path,
              hang_timeout: float | None) -> Stall | None:
        """The instance's stall (None: it progresses, or ``hang_timeout`` is None), after
        reading its rank files now."""
        now = self.clock()
        watched = self._watched.setdefault(key, _Watched(first_seen=now))
        for rank, beat in read_beats(directory).items():
            known = watched.ranks.get(rank)
            if known is None or known[0] != beat:
                watched.ranks[rank] = (beat, now)
        verdict = oldest_stall(watched.ranks, watched.first_seen, now, hang_timeout) \
            if hang_timeout is not None else None
        stall = None
        if verdict is not None:
            stall, pid = verdict
            if pid is not None and process_stopped(pid, key.workload, key.epoch, self.node):
                stall = dataclasses.replace(stall, stopped=True)
        previous = watched.reported
        if stall is None:
            watched.reported = None
        elif previous is None or (previous.rank, previous.step) != (stall.rank, stall.step):
            watched.reported = stall
        return watched.reported

    def pace(self, key: InstanceKey, quantum: float) -> Pace | None:
        """The slowest rank's own time per step (as its last heartbeat said; None before any
        says one), after the last ``stall`` read. The same object until it moves by
        ``quantum`` or another rank becomes the slowest: a report that changes only when it
        matters, not with every step's noise."""
        watched = self._watched.get(key)
        if watched is None:
            return None
        watched.pace = slowest_pace(watched.ranks, watched.pace, quantum)
        return watched.pace

    def restored(self, key: InstanceKey, directory: Path) -> Restore | None:
        """How the instance's slowest rank restored (its SDK's report; None before one
        says), read again until a rank has made progress after the first report (restore
        precedes training, so by then every rank of the node restored), or for
        ``RESTORE_READ_SECONDS`` after it, then kept."""
        now = self.clock()
        watched = self._watched.setdefault(key, _Watched(first_seen=now))
        if watched.restored is None and now - watched.first_seen >= RESTORE_WINDOW_SECONDS:
            watched.restore_final = True  # a workload that reports no restore: read no more
        if not watched.restore_final:
            progressed = bool(watched.ranks)
            watched.restored = read_restored(directory) or watched.restored
            if watched.restored is not None:
                if watched.restored_seen is None:
                    watched.restored_seen = now
                watched.restore_final = (progressed
                                         or now - watched.restored_seen >= RESTORE_READ_SECONDS)
        return watched.restored

    def progressed(self, key: InstanceKey) -> bool:
        """A rank of the instance has reported progress (its start-up is over)."""
        watched = self._watched.get(key)
        return watched is not None and bool(watched.ranks)

    def retire(self, keep: Iterable[InstanceKey]) -> None:
        """Forget every instance not in ``keep``."""
        kept = set(keep)
        for key in [k for k in self._watched if k not in kept]:
            del self._watched[key]
