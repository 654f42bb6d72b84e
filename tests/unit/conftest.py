"""Builders for frozen cluster records and snapshots (no etcd: plain data only)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from hafo.checkpoint import Checkpointer
from hafo.model.cluster import (
    Assignment,
    CheckpointInfo,
    ClusterSnapshot,
    Gpu,
    InstanceState,
    InstanceStatus,
    Liveness,
    NodeRecord,
    Submission,
)
from hafo.model.spec import WorkloadSpec

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"
H100_MIB = 81559
A100_MIB = 40960


def make_node(name: str, gpus: int = 4, *, model: str = H100, memory_mib: int = H100_MIB,
              labels: Mapping[str, str] | None = None, healthy: bool = True,
              unhealthy_gpus: Iterable[int] = ()) -> NodeRecord:
    """A node with ``gpus`` identical GPUs; ``unhealthy_gpus`` lists bad indices."""
    bad = set(unhealthy_gpus)
    return NodeRecord(
        name=name,
        labels=dict(labels or {}),
        gpus=tuple(Gpu(index=i, uuid=f"GPU-{name}-{i}", model=model, memory_mib=memory_mib,
                       healthy=i not in bad) for i in range(gpus)),
        healthy=healthy,
        reason="" if healthy else "checkpoint filesystem read-only",
    )


def make_spec(name: str = "w", gpus: int = 1, **kwargs: Any) -> WorkloadSpec:
    """A workload spec with a fixed argv."""
    return WorkloadSpec(name=name, command=("python", "train.py"), gpus=gpus, **kwargs)


def submit(wid: str, gpus: int = 1, *, submitted_at: float = 0.0,
           spec: WorkloadSpec | None = None, **spec_kwargs: Any) -> Submission:
    """A submission whose spec name is the id."""
    return Submission(id=wid, spec=spec or make_spec(wid, gpus, **spec_kwargs),
                      submitted_at=submitted_at)


def placed(wid: str, node: str, gpus: Iterable[int] = (0,), *, epoch: int = 10,
           **kwargs: Any) -> Assignment:
    """A 'placed' assignment."""
    return Assignment(workload=wid, phase="placed", node=node, gpus=tuple(gpus), epoch=epoch,
                      **kwargs)


def status(wid: str, node: str, epoch: int = 10, state: InstanceState = "running", *,
           exit_code: int | None = None, checkpoint: CheckpointInfo | None = None,
           finished_at: float | None = None, failing: str = "") -> InstanceStatus:
    """An agent's report about one instance."""
    return InstanceStatus(workload=wid, node=node, epoch=epoch, state=state,
                          exit_code=exit_code, checkpoint=checkpoint, finished_at=finished_at,
                          failing=failing)


def make_snapshot(nodes: Iterable[NodeRecord] = (), *, down: Iterable[str] = (),
                  cordoned: Iterable[str] = (), workloads: Iterable[Submission] = (),
                  assignments: Iterable[Assignment] = (),
                  statuses: Iterable[InstanceStatus] = (), leader: str | None = None,
                  controllers: Iterable[str] = (), revision: int = 100) -> ClusterSnapshot:
    """A snapshot where every node not in ``down`` holds a liveness key."""
    node_map = {n.name: n for n in nodes}
    dead = set(down)
    return ClusterSnapshot(
        revision=revision,
        nodes=node_map,
        alive={name: Liveness(node=name, lease=1000 + i, since=0.0)
               for i, name in enumerate(sorted(node_map)) if name not in dead},
        cordoned=frozenset(cordoned),
        workloads={s.id: s for s in workloads},
        assignments={a.workload: a for a in assignments},
        statuses={(s.workload, s.node): s for s in statuses},
        leader=leader,
        controllers=tuple(controllers),
    )


def sample_cluster() -> ClusterSnapshot:
    """Four nodes (ready, cordoned, down, unhealthy) and three workloads."""
    ck_old = CheckpointInfo(step=900, epoch=9, path="/ck/ckpt-e9-s900")
    ck_new = CheckpointInfo(step=40, epoch=20, path="/ck/ckpt-e20-s40")
    return make_snapshot(
        [make_node("a", labels={"rack": "r1"}, unhealthy_gpus=[3]), make_node("b", 2),
         make_node("c", 1), make_node("d", 1, healthy=False)],
        down=["c"], cordoned=["b"], leader="ctl-1", controllers=["ctl-1", "ctl-2"],
        workloads=[submit("run", 2, submitted_at=2.0, priority=3),
                   submit("wait", 1, submitted_at=1.0), submit("new", 1, submitted_at=3.0)],
        assignments=[placed("run", "a", [0, 2], epoch=20, restarts=1),
                     Assignment(workload="wait", phase="pending", epoch=4, reason="no room")],
        statuses=[status("run", "a", 20, checkpoint=ck_new),
                  status("run", "c", 9, "exited", exit_code=1, checkpoint=ck_old)],
    )


@pytest.fixture(autouse=True)
def default_logging() -> Iterator[None]:
    """Unit tests see structlog's defaults (every level), whatever an earlier conftest
    configured; the configuration is restored afterwards."""
    import structlog

    saved = structlog.get_config()
    structlog.reset_defaults()
    try:
        yield
    finally:
        structlog.configure(**saved)


@pytest.fixture
def no_thread_leak() -> Iterator[None]:
    """Fails the test if it leaves a thread running (NVML backends start pollers)."""
    before = set(threading.enumerate())
    yield
    assert set(threading.enumerate()) - before == set()


@pytest.fixture
def kmsg(tmp_path: Path) -> Path:
    """An empty stand-in for /dev/kmsg."""
    path = tmp_path / "kmsg"
    path.write_text("")
    return path


@pytest.fixture
def restore_sigusr1() -> Iterator[None]:
    """A Checkpointer installs a SIGUSR1 handler; put the previous one back."""
    previous = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, previous)


def make_checkpointer(root: Path, epoch: int = 1, **kwargs: Any) -> Checkpointer:
    """A Checkpointer that leaves SIGUSR1 alone (the tests send it themselves)."""
    return Checkpointer(root, epoch=epoch, handle_signal=False, **kwargs)
