"""The progress heartbeat file a workload's SDK writes (``$HAFO_CHECKPOINT_DIR/heartbeat.json``).

Content: ``{"step": int, "epoch": int, "t": wall-clock seconds, "pid": int}`` (and
``"rank": int``; ``"compute"``: the median of the rank's recent own time per step, outside
its collectives, once ``Checkpointer.synced()`` is called; seconds). Written atomically by
``Checkpointer.heartbeat(step)`` and on every committed save; read by the ``progress`` check
and by plugins that detect stalls (a hung NCCL collective stops it).

Each rank also writes its own copy, ``rank-<RANK>.json``, into ``$HAFO_PROGRESS_DIR``: a
directory of the instance on its node's local disk that the agent makes for every instance
(docs/reference/files.md, "Instance directory"). The agent reads those for ``hang_timeout``
(``hafo.agent.progress_watch``): the checkpoint directory is shared by a gang's ranks, its
``heartbeat.json`` says only which rank wrote last.

A ``TieredCheckpointer`` also writes ``restore-<RANK>.json`` there once it restored:
``{"rank", "tier", "epoch", "step", "seconds"}`` (``tier``: ``own``, ``peer``, ``disk`` or
``none``), which the agent reports as ``InstanceStatus.restored``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

HEARTBEAT_FILE = "heartbeat.json"
#: The environment variable naming the instance's progress directory (set by the agent).
PROGRESS_DIR_ENV = "HAFO_PROGRESS_DIR"
#: The most rank files the agent reads in one progress directory (the ranks of one node).
MAX_RANK_FILES = 64


@dataclass(frozen=True)
class Heartbeat:
    """The workload's last reported progress."""

    step: int
    epoch: int
    t: float
    pid: int
    rank: int | None = None
    compute: float | None = None


def parse_heartbeat(text: str) -> Heartbeat | None:
    """The heartbeat in ``text``, or None if it is not a valid heartbeat."""
    try:
        d = json.loads(text)
        rank, compute = d.get("rank"), d.get("compute")
        return Heartbeat(step=int(d["step"]), epoch=int(d["epoch"]), t=float(d["t"]),
                         pid=int(d["pid"]), rank=None if rank is None else int(rank),
                         compute=None if compute is None else _seconds(compute))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def encode_heartbeat(beat: Heartbeat) -> str:
    """The file content for ``beat``."""
    data = {"step": beat.step, "epoch": beat.epoch, "t": beat.t, "pid": beat.pid}
    if beat.rank is not None:
        data["rank"] = beat.rank
    if beat.compute is not None:
        data["compute"] = round(beat.compute, 4)
    return json.dumps(data)


def _seconds(value: object) -> float:
    """A non-negative, finite number of seconds (ValueError otherwise)."""
    seconds = float(value)  # type: ignore[arg-type]
    if not 0.0 <= seconds < 1e9:
        raise ValueError(f"not a duration: {value!r}")
    return seconds


def rank_file_name(rank: int) -> str:
    """The name of ``rank``'s file in the progress directory."""
    return f"rank-{rank}.json"


RESTORE_TIERS = ("own", "peer", "disk", "none")


def restore_file_name(rank: int) -> str:
    """The name of ``rank``'s restore report in the progress directory."""
    return f"restore-{rank}.json"


def restore_rank_of_file(name: str) -> int | None:
    """The rank a restore report's file name is for (None: not one)."""
    if not (name.startswith("restore-") and name.endswith(".json")):
        return None
    digits = name[len("restore-"):-len(".json")]
    return int(digits) if digits.isdigit() and len(digits) <= 6 else None


def parse_restore(text: str) -> tuple[int, str, int | None, float] | None:
    """``(rank, tier, step, seconds)`` of a restore report, or None if it is not one."""
    try:
        d = json.loads(text)
        tier = str(d["tier"])
        step = d.get("step")
        rank = int(d["rank"])
        if tier not in RESTORE_TIERS or rank < 0:
            return None
        return (rank, tier, None if step is None else int(step), _seconds(d["seconds"]))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def rank_of_file(name: str) -> int | None:
    """The rank a progress directory's file name is for (None: not a rank file)."""
    if not (name.startswith("rank-") and name.endswith(".json")):
        return None
    digits = name[len("rank-"):-len(".json")]
    return int(digits) if digits.isdigit() and len(digits) <= 6 else None
