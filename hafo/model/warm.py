"""The warm-survivor protocol between a gang member's guard and the SDK in its process
(docs/reference/checkpoint-sdk.md, "Warm survivors"; safety: docs/safety.md, "Warm survivors
keep the epoch rule").

A gang whose spec says ``warm: true`` keeps its survivors' processes when it starts a new
epoch because a member was lost. Each member process gets a directory of its own,
``$HAFO_WARM_DIR`` (made by the agent, mode 0700, one per process: it moves with the process
from instance to instance), where three files pass, each written atomically (a rename):

- ``park.json`` (guard -> process), ``{"epoch": E}``: leave epoch E's process group and wait.
- ``parked.json`` (process -> guard), ``{"epoch": E, "pid": P, "t": T}``: the process of
  pid P has torn down its process group of epoch E: it holds no link to any rank of E and
  opens none until it is handed a next epoch. Only this confirmation makes a parked member
  count as stopped for the gang's next epoch; without it within the guard's park wait the
  member is stopped as before (checkpoint, SIGTERM, SIGKILL).
- ``epoch.json`` (guard -> process), ``{"epoch": E2, "env": {NAME: VALUE}}``: the process is
  now the instance of epoch E2 (> E) of its node: ``env`` holds the variables whose values
  differ from its previous instance's (``HAFO_EPOCH``, ``RANK``, ``WORLD_SIZE``,
  ``MASTER_ADDR``, ``MASTER_PORT``, ``HAFO_PROGRESS_DIR``, ...); it sets them and joins E2.

Pure: parsing and encoding only; the files are read and written by ``hafo.agent.guard`` and
``hafo.checkpoint.warm``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The environment variable naming a warm member's directory (set by the agent).
WARM_DIR_ENV = "HAFO_WARM_DIR"
#: Set to ``1`` for a warm gang's standby (a process on a spare node with no rank yet): it
#: parks at once, before any process group, and is handed the member placed on its node.
STANDBY_ENV = "HAFO_WARM_STANDBY"
PARK_FILE = "park.json"
PARKED_FILE = "parked.json"
EPOCH_FILE = "epoch.json"
#: Variables never handed to a warm process: its GPUs stay the ones it opened (the agent
#: hands an instance over only when the new member has the same GPUs).
NOT_HANDED = frozenset({"CUDA_VISIBLE_DEVICES", "HAFO_WARM_DIR"})
#: The most bytes of one protocol file that are read (a handed-over environment is small).
MAX_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class ParkRequest:
    """The guard asks the process of ``epoch`` to park."""

    epoch: int


@dataclass(frozen=True)
class Parked:
    """The process ``pid`` left ``epoch``'s process group at wall-clock time ``t``."""

    epoch: int
    pid: int
    t: float


@dataclass(frozen=True)
class NextEpoch:
    """The process is handed ``epoch``; ``env``: the variables that changed."""

    epoch: int
    env: Mapping[str, str] = field(default_factory=dict)


def _object(text: str) -> dict[str, Any] | None:
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    return raw if isinstance(raw, dict) else None


def _int(raw: Any) -> int | None:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0 else None


def parse_park(text: str) -> ParkRequest | None:
    """The request in ``text``; None if it is not one."""
    raw = _object(text)
    epoch = _int(raw.get("epoch")) if raw is not None else None
    return ParkRequest(epoch) if epoch is not None else None


def encode_park(request: ParkRequest) -> str:
    """The file content for ``request``."""
    return json.dumps({"epoch": request.epoch})


def parse_parked(text: str) -> Parked | None:
    """The confirmation in ``text``; None if it is not one."""
    raw = _object(text)
    if raw is None:
        return None
    epoch, pid, t = _int(raw.get("epoch")), _int(raw.get("pid")), raw.get("t")
    if epoch is None or not pid or not isinstance(t, (int, float)) or isinstance(t, bool):
        return None
    return Parked(epoch, pid, float(t))


def encode_parked(parked: Parked) -> str:
    """The file content for ``parked``."""
    return json.dumps({"epoch": parked.epoch, "pid": parked.pid, "t": parked.t})


def parse_next_epoch(text: str) -> NextEpoch | None:
    """The hand-over in ``text``; None if it is not one (an ``env`` that is not a mapping of
    strings to strings, or one naming a variable never handed over)."""
    raw = _object(text)
    if raw is None:
        return None
    epoch, env = _int(raw.get("epoch")), raw.get("env", {})
    if epoch is None or not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and "=" not in k
            and k not in NOT_HANDED for k, v in env.items()):
        return None
    return NextEpoch(epoch, dict(env))


def encode_next_epoch(handed: NextEpoch) -> str:
    """The file content for ``handed``."""
    return json.dumps({"epoch": handed.epoch, "env": dict(handed.env)})


def changed_env(old: Mapping[str, str], new: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``new`` whose values differ from ``old``'s (none of ``NOT_HANDED``).
    A variable ``old`` had and ``new`` lacks is handed as the empty string."""
    out = {k: v for k, v in new.items() if old.get(k) != v and k not in NOT_HANDED}
    out.update({k: "" for k in old if k not in new and k not in NOT_HANDED})
    return out
