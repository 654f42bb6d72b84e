"""JSON encoding of model records into etcd values, and decoding of keys back into records.

Decoding parses the JSON text straight into the record's dataclass with the record's own
declaration (``hafo.model.schema.Record``), without building dicts first: at 10,000 nodes a
snapshot decodes thousands of these per second.
"""

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
    StandbyRecord,
    Submission,
)
from hafo.model.queues import QueueSpec, parse_queue
from hafo.model.schema import schema_of

_ASSIGNMENT = schema_of(Assignment)
_NODE = schema_of(NodeRecord)
_LIVENESS = schema_of(Liveness)
_STATUS = schema_of(InstanceStatus)
_SUBMISSION = schema_of(Submission)
_MOVE = schema_of(MoveRequest)
_EVENT = schema_of(Event)
_STANDBY = schema_of(StandbyRecord)


def encode(data: dict[str, Any]) -> bytes:
    """Compact, key-sorted JSON bytes."""
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def decode(value: bytes) -> Any:
    """JSON bytes -> Python value."""
    return json.loads(value.decode())


def encode_submission(submission: Submission) -> bytes:
    """A workload record: id, spec, submit time."""
    return encode(submission.to_dict())


def decode_submission(value: bytes) -> Submission:
    """Inverse of ``encode_submission`` (the spec is validated again). Not straight from the
    JSON text: the spec's validators take Python values, and ``json.loads`` makes them
    faster than pydantic's JSON-to-Python conversion."""
    return _SUBMISSION.validate(decode(value))


def decode_assignment(value: bytes, mod_revision: int) -> Assignment:
    """An assignment; its epoch is the key's mod_revision."""
    return _ASSIGNMENT.validate_json(value, context={"epoch": mod_revision})


def decode_standby(value: bytes) -> StandbyRecord:
    """A warm gang's standby record."""
    return _STANDBY.validate_json(value)


def decode_node(value: bytes) -> NodeRecord:
    """A node's inventory record."""
    return _NODE.validate_json(value)


def decode_liveness(value: bytes) -> Liveness:
    """A node's liveness record."""
    return _LIVENESS.validate_json(value)


def decode_status(value: bytes) -> InstanceStatus:
    """An agent's instance report."""
    return _STATUS.validate_json(value)


def decode_controller(value: bytes) -> str:
    """A controller's registration: its API base URL ('' if unknown)."""
    data = decode(value) if value else {}
    return str(data.get("api", "")) if isinstance(data, dict) else ""


def decode_failsafe(value: bytes) -> FailsafeSet:
    """The failsafe set."""
    return FailsafeSet.from_dict(decode(value))


def decode_move(value: bytes) -> MoveRequest:
    """A move request."""
    return _MOVE.validate_json(value)


def decode_event(value: bytes) -> Event:
    """An event."""
    return _EVENT.validate_json(value)


def encode_queue(spec: QueueSpec) -> bytes:
    """A declared queue (``Keys.queue``)."""
    return encode(spec.to_dict())


def decode_queue(value: bytes) -> QueueSpec:
    """Inverse of ``encode_queue`` (validated again: ValidationError, a ValueError, names the
    field of a value that is not a queue)."""
    return parse_queue(decode(value))
