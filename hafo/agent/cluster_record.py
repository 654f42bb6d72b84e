"""The cluster record: which store identity this node's agent trusts
(``hafo.decisions.store_trust``), kept in the state directory beside the lease record, so
that an agent restarted on an etcd that lost its data knows it is not its cluster."""

from __future__ import annotations

import json
from pathlib import Path

from hafo.agent.instances import INSTANCES, write_json_atomic
from hafo.decisions.store_trust import Known

CLUSTER_RECORD = ".cluster.json"


def read_cluster_record(state_dir: Path) -> Known | None:
    """What an earlier run trusted, or None (a new node, a wiped state directory, or a file
    that cannot be read: then the store's identity is taken as found)."""
    try:
        return Known.from_dict(json.loads((state_dir / INSTANCES / CLUSTER_RECORD).read_text()))
    except (OSError, ValueError):
        return None


def write_cluster_record(state_dir: Path, known: Known) -> None:
    """Replace the record atomically."""
    root = state_dir / INSTANCES
    root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(root / CLUSTER_RECORD, known.to_dict())
