"""Where a workload's instances serve: one ``Endpoint`` per replica (docs/reference/workloads.md,
"Endpoints"), the JSON of ``GET /v1/workloads/{name}/endpoints`` and ``hafo endpoints``, and
what ``hafo lb haproxy`` puts in rotation. Pure.

One rule decides "ready" for everything that needs it (``instance_ready``): the endpoints of
the API and CLI, ``hafo lb haproxy``, Prometheus discovery and the rolling updates of
``hafo.decisions.services``: the instance of the replica's current assignment runs on a node
whose agent is alive (not merely not yet confirmed expired), reports every readiness check
passing, and the replica is not being replaced (docs/reference/workloads.md, "Readiness").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hafo.model.cluster import ClusterSnapshot, InstanceStatus
from hafo.model.schema import Record


@dataclass(frozen=True, slots=True)
class Endpoint(Record):
    """One replica (for a workload that is not a service: its one instance).

    ``node``/``address``: where it runs (None while it is not placed); ``ports``: its ports by
    name as bound there; ``ready``: in rotation now (its instance runs, every readiness check
    passes, its node is alive and it is not being replaced); ``state``: the instance's state
    as its agent reports it ("pending" before it is placed); ``epoch``: its instance."""

    replica: str
    node: str | None
    address: str | None
    ports: Mapping[str, int] = field(default_factory=dict)
    ready: bool = False
    state: str = "pending"
    epoch: int = 0
    retiring: bool = False


@dataclass(frozen=True, slots=True)
class Endpoints(Record):
    """Every endpoint of one workload (its id and name), in replica order."""

    workload: str
    name: str
    endpoints: tuple[Endpoint, ...] = ()

    @property
    def ready(self) -> tuple[Endpoint, ...]:
        """The endpoints in rotation."""
        return tuple(e for e in self.endpoints if e.ready)



def serving_status(snapshot: ClusterSnapshot, wid: str) -> InstanceStatus | None:
    """The report of the instance a workload's current assignment runs, if it is placed
    there and its node is alive (None otherwise)."""
    assignment = snapshot.assignments.get(wid)
    if assignment is None or assignment.phase != "placed" or assignment.node is None:
        return None
    node = assignment.node
    if node not in snapshot.alive or node in snapshot.expiring:
        return None
    return snapshot.current_status(wid)


def instance_ready(snapshot: ClusterSnapshot, wid: str) -> bool:
    """In rotation: see the module docstring."""
    submission = snapshot.workloads.get(wid)
    if submission is None or submission.retiring is not None:
        return False
    status = serving_status(snapshot, wid)
    return status is not None and status.state == "running" and status.ready \
        and not status.failing


def ready_for(snapshot: ClusterSnapshot, wid: str, seconds: float, now: float,
              seen: Mapping[tuple[str, str, int], float]) -> bool:
    """Ready, and for at least ``seconds`` by the deciding controller's clock: ``seen``
    maps an instance (workload, node, epoch) to when that controller first saw it ready
    (``hafo.decisions.observed``; an instance it has not seen ready is seen first ``now``).
    The agent's ``ready_since`` is its own wall clock and is never compared with ``now``
    (docs/safety.md, "One clock per decision")."""
    if not instance_ready(snapshot, wid):
        return False
    status = serving_status(snapshot, wid)
    if status is None:
        return False
    return now - seen.get((wid, status.node, status.epoch), now) >= seconds


def _endpoint(snapshot: ClusterSnapshot, wid: str) -> Endpoint:
    submission = snapshot.workloads[wid]
    assignment = snapshot.assignments.get(wid)
    node = assignment.node if assignment is not None and assignment.holds_node else None
    record = snapshot.nodes.get(node) if node is not None else None
    status = snapshot.current_status(wid) if node is not None else None
    ports = dict(status.ports) if status is not None and status.ports else {
        name: port for name, port in submission.spec.ports.items() if port}
    state: str = status.state if status is not None else (
        assignment.phase if assignment is not None else "pending")
    if node is not None and (node not in snapshot.alive or node in snapshot.expiring):
        state = "lost"
    return Endpoint(replica=wid, node=node,
                    address=(record.address or node) if record is not None else node,
                    ports=ports, ready=instance_ready(snapshot, wid), state=state,
                    epoch=assignment.epoch if assignment is not None and node else 0,
                    retiring=submission.retiring is not None)


def endpoints_of(snapshot: ClusterSnapshot, wid: str) -> Endpoints:
    """Every replica of a service (one endpoint for any other workload), oldest first.
    KeyError if ``wid`` is not a workload of the snapshot."""
    submission = snapshot.workloads[wid]
    members = snapshot.replicas.get(wid, ()) if submission.spec.is_service else (wid,)
    return Endpoints(workload=wid, name=submission.spec.name,
                     endpoints=tuple(_endpoint(snapshot, r) for r in members))


def resolve(snapshot: ClusterSnapshot, ref: str) -> tuple[str | None, str]:
    """The workload id ``ref`` names (an id, or the name of one workload): (id, "") or
    (None, why not)."""
    if ref in snapshot.workloads:
        return ref, ""
    ids = snapshot.by_name.get(ref, ())
    if len(ids) == 1:
        return ids[0], ""
    if ids:
        return None, (f"{len(ids)} workloads are named {ref!r} (submitted before names were "
                      f"unique): use an id ({', '.join(ids)})")
    return None, f"no workload {ref!r}"


def replica_on(snapshot: ClusterSnapshot, service: str, node: str) -> str | None:
    """The replica of ``service`` that runs on ``node`` and is not being replaced, if any."""
    for rid in snapshot.replicas.get(service, ()):
        assignment = snapshot.assignments.get(rid)
        if snapshot.workloads[rid].retiring is None and assignment is not None \
                and assignment.holds_node and node in assignment.nodes:
            return rid
    return None


def move_target(snapshot: ClusterSnapshot, wid: str,
                node: str | None) -> tuple[str | None, str | None, str]:
    """What a planned move of workload ``wid`` (``--from NODE`` / the body's ``node``) moves:
    (workload id, gang member's node, "") ; for a service and a node, its replica there, or
    (None, None, why not)."""
    submission = snapshot.workloads.get(wid)
    if submission is not None and submission.spec.is_service and submission.service is None \
            and node is not None:
        replica = replica_on(snapshot, wid, node)
        if replica is None:
            return None, None, f"no replica of {wid!r} runs on {node!r}"
        return replica, None, ""
    return wid, node, ""


def agent_targets(snapshot: ClusterSnapshot) -> list[dict[str, object]]:
    """Prometheus HTTP service discovery of the agents (``GET /v1/sd/agents``): one target
    group per node whose agent published its API address (``api.listen``; with the node's
    ``address`` as host when it listens on a wildcard), down nodes included, so that
    Prometheus shows them down instead of forgetting them; labelled ``hafo_node``."""
    groups: list[dict[str, object]] = []
    for name in sorted(snapshot.nodes):
        record = snapshot.nodes[name]
        host, colon, port = record.api.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not colon or not port.isdigit():
            continue
        if host in ("", "0.0.0.0", "::"):
            host = record.address
        if not host:
            continue
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        groups.append({"targets": [where], "labels": {"hafo_node": name}})
    return groups


def prometheus_targets(snapshot: ClusterSnapshot, wids: list[str],
                       port: str | None = None) -> list[dict[str, object]]:
    """Prometheus HTTP service discovery (``http_sd_configs``): one target group per running
    replica and port (only port ``port`` when given), labelled with the workload's name and
    id, the replica, node, port name and readiness."""
    groups: list[dict[str, object]] = []
    for wid in wids:
        found = endpoints_of(snapshot, wid)
        for endpoint in found.endpoints:
            if endpoint.node is None or endpoint.state not in ("running", "starting"):
                continue
            for name, number in sorted(endpoint.ports.items()):
                if port is not None and name != port:
                    continue
                groups.append({"targets": [f"{endpoint.address}:{number}"], "labels": {
                    "hafo_workload": found.name, "hafo_workload_id": found.workload,
                    "hafo_replica": endpoint.replica, "hafo_node": endpoint.node,
                    "hafo_port": name, "hafo_ready": str(endpoint.ready).lower()}})
    return groups
