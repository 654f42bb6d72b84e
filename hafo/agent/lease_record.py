"""The lease record: which etcd lease this node's agent holds, kept in the state directory.

A restarted agent reads it first (``hafo.agent.early_renewal``, before the heavy imports), so
this module needs nothing but the standard library and the instance records' writer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hafo.agent.instances import INSTANCES, write_json_atomic

LEASE_RECORD = ".lease.json"
LEGACY_LEASE_RECORD = "lease.json"  # before the claim rule: beside instances/, no claim


@dataclass(frozen=True)
class LeaseRecord:
    """What an agent remembers of its hold on the node."""

    lease: int
    claimed: int


def read_record(state_dir: Path) -> LeaseRecord | None:
    """The lease record, or None (no records of ours: a new claimant). The legacy location
    is read only while the instance records directory exists beside it."""
    for path in (state_dir / INSTANCES / LEASE_RECORD, state_dir / LEGACY_LEASE_RECORD):
        if path.name == LEGACY_LEASE_RECORD and not (state_dir / INSTANCES).is_dir():
            continue
        try:
            data = json.loads(path.read_text())
            return LeaseRecord(int(data["lease"]), int(data.get("claimed", 0)))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def write_record(state_dir: Path, record: LeaseRecord) -> None:
    """Replace the lease record atomically (and drop the legacy one)."""
    root = state_dir / INSTANCES
    root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(root / LEASE_RECORD, {"lease": record.lease, "claimed": record.claimed})
    (state_dir / LEGACY_LEASE_RECORD).unlink(missing_ok=True)
