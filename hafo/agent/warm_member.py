"""The guard's side of a warm gang member (``warm: true``; protocol: ``hafo.model.warm``).

The agent asks through the instance directory: ``park`` (an empty file: park this instance)
and ``handover.json`` (``{"to": DIR}``: the parked process becomes the instance launched in
``DIR``). The guard passes them to the process through its warm directory
(``$HAFO_WARM_DIR``): ``park.json`` out, ``parked.json`` back, ``epoch.json`` out.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path

from hafo.agent.instances import write_json_atomic
from hafo.model.warm import (
    EPOCH_FILE,
    PARK_FILE,
    PARKED_FILE,
    NextEpoch,
    ParkRequest,
    changed_env,
    encode_next_epoch,
    encode_park,
    parse_parked,
)
from hafo.warm_files import read_protocol_file, write_protocol_file

#: The agent's request, in the instance directory: park this instance.
PARK_REQUEST = "park"
#: The agent's hand-over, in the instance directory: ``{"to": DIR}``.
HANDOVER_FILE = "handover.json"


class WarmLink:
    """The files between a guard, its agent (``instance``) and its process (``warm_dir``)."""

    def __init__(self, warm_dir: Path, instance: Path) -> None:
        self.warm_dir = warm_dir
        self.instance = instance

    def park_asked(self) -> bool:
        """The agent asked this instance to park."""
        return (self.instance / PARK_REQUEST).exists()

    def request_park(self, epoch: int) -> None:
        """Ask the process to leave ``epoch``'s process group (any older confirmation is
        removed first, so only one of this epoch counts)."""
        with contextlib.suppress(FileNotFoundError):
            (self.warm_dir / PARKED_FILE).unlink()
        write_protocol_file(self.warm_dir / PARK_FILE, encode_park(ParkRequest(epoch)))

    def parked(self, epoch: int, pid: int) -> bool:
        """The process ``pid`` confirmed that it left ``epoch``'s process group."""
        text = read_protocol_file(self.warm_dir / PARKED_FILE)
        confirmed = parse_parked(text) if text is not None else None
        return confirmed is not None and confirmed.epoch == epoch and confirmed.pid == pid

    def handover_target(self) -> Path | None:
        """The directory of the instance the agent hands the process to, if it asked."""
        text = read_protocol_file(self.instance / HANDOVER_FILE)
        if text is None:
            return None
        try:
            raw = json.loads(text)
        except ValueError:
            return None
        target = raw.get("to") if isinstance(raw, dict) else None
        return Path(target) if isinstance(target, str) and target else None

    def hand_over(self, epoch: int, old_env: Mapping[str, str],
                  new_env: Mapping[str, str]) -> None:
        """Tell the process it is now the instance of ``epoch``, with the variables that
        changed."""
        write_protocol_file(self.warm_dir / EPOCH_FILE,
                    encode_next_epoch(NextEpoch(epoch, changed_env(old_env, new_env))))


def ask_park(instance: Path) -> None:
    """The agent's side: ask the instance's guard to have its process park."""
    (instance / PARK_REQUEST).touch()


def ask_handover(instance: Path, target: Path) -> None:
    """The agent's side: hand the parked process of ``instance`` to the instance launched in
    ``target``."""
    write_json_atomic(instance / HANDOVER_FILE, {"to": str(target)})
