"""The ``hafo dev`` control protocol: what travels on the running dev cluster's UNIX socket
``$HAFO_DEV/control.sock``, one JSON line in (``ControlRequest``), one JSON line out
(``ControlReply``, with a ``DevStatus``), and the checks the cluster makes before acting.

The messages are declarations in the style of ``hafo.model`` (frozen dataclasses that
pydantic validates, ``hafo.model.schema``): a request is checked like what people write
(unknown fault fields refused; every error names its field, ``fault.xid: must be an
integer``); a reply like a record hafo writes (unknown keys ignored, missing ones take their
defaults, so replies of an earlier ``hafo dev`` still parse). Plain data and pure functions.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import ConfigDict, Strict

from hafo.model.errors import ValidationError
from hafo.model.schema import INTEGER, Flag, Number, Record, Schema, Section

SOCKET_NAME = "control.sock"
#: the longest request line the cluster reads, in bytes
MAX_REQUEST = 64 * 1024

OK, USAGE, UNAVAILABLE, NOT_FOUND = 0, 2, 3, 4  # exit codes (hafo.exits)

Action = Literal["status", "power-off", "power-on", "fault"]
ACTIONS: tuple[str, ...] = get_args(Action)
Integer = Annotated[int, INTEGER]


class DevUnavailable(Exception):
    """No dev cluster answers at the given directory (or the reply was not understood)."""


def socket_path(dev_dir: Path) -> Path:
    """Where the running ``hafo dev`` listens."""
    return dev_dir / SOCKET_NAME


# -- requests -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuFault(Section):
    """One simulated GPU's fault, as ``hafo dev fault`` sets it; all empty clears the GPU."""

    xid: Integer | None = None
    lost: Flag = False
    ecc_dbe: Integer | None = None
    thermal: Number | None = None

    def entry(self) -> dict[str, Any]:
        """The GPU's entry in the faults file (docs/reference/simulation.md, "Simulated GPUs")."""
        out: dict[str, Any] = {}
        if self.xid is not None:
            out["xid"] = self.xid
        if self.lost:
            out["lost"] = True
        if self.ecc_dbe is not None:
            out["ecc_dbe"] = self.ecc_dbe
        if self.thermal is not None:
            out["thermal"] = self.thermal
        return out

    def describe(self) -> str:
        """Human words for the fault."""
        parts = []
        if self.xid is not None:
            parts.append(f"Xid {self.xid}")
        if self.lost:
            parts.append("fallen off the bus (lost)")
        if self.ecc_dbe is not None:
            parts.append(f"{self.ecc_dbe} double-bit ECC error(s)")
        if self.thermal is not None:
            parts.append(f"thermal slowdown at {self.thermal:g} C")
        return ", ".join(parts) or "no fault (cleared)"


@dataclass(frozen=True, slots=True)
class ControlRequest(Section):
    """What a ``hafo dev`` control command asks the running dev cluster (keys it does not
    know are ignored; a fault's are refused)."""

    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="ignore")

    action: Action
    node: Annotated[str, Strict()] | None = None
    gpu: Integer | None = None
    fault: GpuFault | None = None

    def to_json(self) -> str:
        """One line of JSON."""
        return json.dumps(_request_schema().dump(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ControlRequest:
        """Parse a request line; ValidationError (a ValueError) names every bad field, the
        first one first (``request`` for the line itself)."""
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError):
            raise ValidationError("request", "not JSON") from None
        return _request_schema().validate(raw)


@functools.cache
def _request_schema() -> Schema[ControlRequest]:
    """The request's schema (made on first use): errors name fields from the top
    (``fault.xid``), the request itself ``request``."""
    return Schema(ControlRequest, root="request", prefix="")


def parse_request(line: bytes) -> ControlRequest | ControlReply:
    """One request line as it came (cut at ``MAX_REQUEST`` bytes) -> the request, or the
    reply that refuses it: one line naming each bad field, exit code 2."""
    try:
        return ControlRequest.from_json(line[:MAX_REQUEST].decode(errors="replace"))
    except ValidationError as exc:
        return ControlReply(False, "; ".join(exc.lines()), USAGE)


# -- replies --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeState(Record):
    """One node of the dev cluster as ``hafo dev status`` reports it."""

    name: str
    powered: bool
    agent_pid: int | None
    api: str
    faults: dict[str, dict[str, Any]] = field(default_factory=dict)
    agent_alive: bool | None = None  # None: not powered (or a dev cluster before this field)

    def agent_words(self) -> str:
        """The agent in words: ``pid 123``, ``dead (pid 123 exited)``, ``-`` (powered off)."""
        if not self.powered or self.agent_pid is None:
            return "-"
        if self.agent_alive is False:
            return f"dead (pid {self.agent_pid} exited)"
        return f"pid {self.agent_pid}"


@dataclass(frozen=True, slots=True)
class ControllerState(Record):
    """One controller of the dev cluster."""

    name: str
    running: bool
    dashboard: str


@dataclass(frozen=True, slots=True)
class DevStatus(Record):
    """The whole dev cluster: where it is and what runs (``to_dict`` is ``hafo dev status
    --json``)."""

    cluster: str
    dir: str
    etcd: list[str]
    gpus_per_node: int
    controllers: list[ControllerState]
    nodes: list[NodeState]

    def node(self, name: str) -> NodeState | None:
        """The node of that name, if any."""
        return next((n for n in self.nodes if n.name == name), None)


@dataclass(frozen=True, slots=True)
class ControlReply(Record):
    """The dev cluster's answer: ``code`` is the exit code the command returns."""

    ok: bool
    message: str
    code: int = OK
    status: DevStatus | None = None

    def to_json(self) -> str:
        """One line of JSON."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ControlReply:
        """Parse a reply line; DevUnavailable if it is not one."""
        try:
            return cls.from_dict(json.loads(text))
        except (ValueError, RecursionError):  # not JSON, or not a reply (ValidationError)
            raise DevUnavailable(f"not a hafo dev reply: {text[:80]!r}") from None


def check_request(request: ControlRequest, nodes: Sequence[str],
                  gpus: int) -> ControlReply | None:
    """The error reply for a request the cluster cannot act on (unknown node: exit 4; a GPU
    index out of range or a missing field: exit 2), None when it is acceptable."""
    if request.action == "status":
        return None
    if request.node is None:
        return ControlReply(False, "node: required", USAGE)
    if request.node not in nodes:
        return ControlReply(False, f"no node {request.node!r} in this dev cluster "
                                   f"(nodes: {', '.join(nodes)})", NOT_FOUND)
    if request.action == "fault":
        if request.gpu is None or request.fault is None:
            return ControlReply(False, "gpu and fault: required", USAGE)
        if not 0 <= request.gpu < gpus:
            return ControlReply(False, f"--gpu: {request.node} has GPUs 0 to {gpus - 1}, "
                                       f"not {request.gpu}", USAGE)
    return None
