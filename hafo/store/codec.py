"""JSON encoding of model records into etcd values, and decoding of keys back into records."""

from __future__ import annotations

import json
from typing import Any

from hafo.model.cluster import (
    Assignment,
    Event,
    FailsafeSet,
    InstanceStatus,
    Liveness,
    MoveRequest,
    NodeRecord,
    Submission,
)
from hafo.model.spec import parse_spec


def encode(data: dict[str, Any]) -> bytes:
    """Compact, key-sorted JSON bytes."""
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def decode(value: bytes) -> Any:
    """JSON bytes -> Python value."""
    return json.loads(value.decode())


def encode_submission(submission: Submission) -> bytes:
    """A workload record: id, spec, submit time."""
    return encode({"id": submission.id, "spec": submission.spec.to_dict(),
                   "submitted_at": submission.submitted_at})


def decode_submission(value: bytes) -> Submission:
    """Inverse of ``encode_submission`` (the spec is validated again)."""
    data = decode(value)
    return Submission(id=str(data["id"]), spec=parse_spec(data["spec"]),
                      submitted_at=float(data["submitted_at"]))


def decode_assignment(value: bytes, mod_revision: int) -> Assignment:
    """An assignment; its epoch is the key's mod_revision."""
    return Assignment.from_dict(decode(value), epoch=mod_revision)


def decode_node(value: bytes) -> NodeRecord:
    """A node's inventory record."""
    return NodeRecord.from_dict(decode(value))


def decode_liveness(value: bytes) -> Liveness:
    """A node's liveness record."""
    return Liveness.from_dict(decode(value))


def decode_status(value: bytes) -> InstanceStatus:
    """An agent's instance report."""
    return InstanceStatus.from_dict(decode(value))


def decode_controller(value: bytes) -> str:
    """A controller's registration: its API base URL ('' if unknown)."""
    data = decode(value) if value else {}
    return str(data.get("api", "")) if isinstance(data, dict) else ""


def decode_failsafe(value: bytes) -> FailsafeSet:
    """The failsafe set."""
    return FailsafeSet.from_dict(decode(value))


def decode_move(value: bytes) -> MoveRequest:
    """A move request."""
    return MoveRequest.from_dict(decode(value))


def decode_event(value: bytes) -> Event:
    """An event."""
    return Event.from_dict(decode(value))
