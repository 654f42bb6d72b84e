"""The progress heartbeat file a workload's SDK writes (``$HAFO_CHECKPOINT_DIR/heartbeat.json``).

Content: ``{"step": int, "epoch": int, "t": wall-clock seconds, "pid": int}``. Written
atomically by ``Checkpointer.heartbeat(step)`` and on every committed save; read by the
``progress`` check and by plugins that detect stalls (a hung NCCL collective stops it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

HEARTBEAT_FILE = "heartbeat.json"


@dataclass(frozen=True)
class Heartbeat:
    """The workload's last reported progress."""

    step: int
    epoch: int
    t: float
    pid: int


def parse_heartbeat(text: str) -> Heartbeat | None:
    """The heartbeat in ``text``, or None if it is not a valid heartbeat."""
    try:
        d = json.loads(text)
        return Heartbeat(step=int(d["step"]), epoch=int(d["epoch"]), t=float(d["t"]),
                         pid=int(d["pid"]))
    except (ValueError, TypeError, KeyError):
        return None


def encode_heartbeat(beat: Heartbeat) -> str:
    """The file content for ``beat``."""
    return json.dumps({"step": beat.step, "epoch": beat.epoch, "t": beat.t, "pid": beat.pid})
