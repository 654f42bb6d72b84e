"""Gangs on a real local cluster: a real torch.distributed DDP job (examples/ddp_train.py)
started by real torchrun through hafo's rendezvous environment, as a 2- and a 3-member gang.

Faults: power loss of one member's node (its whole process tree SIGKILLed at once), a
member's process crash, a drain of one member's node. After each: the gang trains again from
its latest checkpoint with the loss going on from where it was, and no two epochs of the gang
were ever alive at once (the progress log of every rank, ``hafo.local.progress.overlaps``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hafo.local.cluster import LocalCluster
from hafo.local.procs import descendants
from hafo.model.cluster import ClusterSnapshot
from hafo.model.views import node_view, workload_view
from hafo.store import intents, read_events

from .conftest import ClusterFactory
from .helpers import assert_never_two_copies

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
SPARE = "spare-1"
pytestmark = pytest.mark.timeout(300)  # a bound for liveness: torch gangs on 2 busy cores


def ddp_spec(name: str, nodes: int, **extra: Any) -> dict[str, Any]:
    """The DDP example as a gang: one process per member, gloo on the CPU."""
    return {"name": name, "nodes": nodes, "gpus": 1, "stop_grace": 15,
            "command": [TORCHRUN, str(ROOT / "examples" / "ddp_train.py"), "--steps", "0",
                        "--every", "10", "--sleep", "0.05"],
            "env": {"HAFO_DDP_TIMEOUT": "30"}, **extra}


async def gang_cluster(factory: ClusterFactory, nodes: int, **extra: Any) -> LocalCluster:
    """``nodes`` ordinary nodes and one node labelled as a spare."""
    cluster = await factory.start(nodes=nodes, controllers=1, gpus_per_node=1, **extra)
    cluster.add_node(SPARE, labels={"zone": "local", "hafo.io/spare": "true"})
    cluster.start_node(SPARE)
    await cluster.wait_ready(45)
    return cluster


def members(snapshot: ClusterSnapshot, wid: str) -> list[tuple[int, str, str]]:
    return [(m["rank"], m["node"], m["state"]) for m in workload_view(snapshot, wid)["members"]]


def training(wid: str, after_epoch: int = 0) -> Any:
    """Predicate: every member runs, in an epoch above ``after_epoch``."""
    def check(snapshot: ClusterSnapshot) -> bool:
        view = workload_view(snapshot, wid)
        return bool(view["state"] == "running" and (view["epoch"] or 0) > after_epoch)
    return check


def steps(cluster: LocalCluster, wid: str, epoch: int | None = None) -> list[dict[str, Any]]:
    return [line for line in cluster.progress_log(wid)
            if line.get("event") == "step" and (epoch is None or line["epoch"] == epoch)]


async def wait_steps(cluster: LocalCluster, wid: str, epoch: int, count: int,
                     timeout: float = 150) -> list[dict[str, Any]]:
    """Until rank 0 of ``epoch`` logged ``count`` steps (a bound for liveness, not a figure:
    beside other workers on 2 cores a torch gang's step can take seconds)."""
    try:
        await cluster.wait_for(lambda s: len([x for x in steps(cluster, wid, epoch)
                                              if x["rank"] == 0]) >= count,
                               timeout, what=f"{count} steps of epoch {epoch}")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{await gang_story(cluster, wid)}") from None
    return steps(cluster, wid, epoch)


async def gang_story(cluster: LocalCluster, wid: str) -> str:
    """What happened to the gang, for a failure's message: its view now, every epoch's
    progress (starts, errors, steps per rank) and the controllers' decisions about it."""
    view = workload_view(await cluster.snapshot(), wid)
    lines = [f"now: state {view['state']}, epoch {view['epoch']}, restarts "
             f"{view['restarts']}, reason {view['reason']!r}, members {view['members']}"]
    counts: dict[tuple[int, int], int] = {}
    for line in cluster.progress_log(wid):
        if line.get("event") == "step":
            key = (line["epoch"], line["rank"])
            counts[key] = counts.get(key, 0) + 1
        else:
            lines.append(f"progress: {line}"[:400])
    lines.append(f"steps per (epoch, rank): {dict(sorted(counts.items()))}")
    for path in sorted((cluster.base / "logs").glob("*.log")):
        for text in path.read_text(errors="replace").splitlines():
            if wid in text and ('"decision"' in text or "instance" in text):
                lines.append(f"{path.name}: {text}"[:400])
    return "\n".join(lines[-80:])


def resumed_from(cluster: LocalCluster, wid: str, epoch: int) -> int:
    starts = [line["resumed_from"] for line in cluster.progress_log(wid)
              if line.get("event") == "start" and line["epoch"] == epoch]
    assert starts, f"epoch {epoch} never started"
    assert len(set(starts)) == 1, f"ranks of epoch {epoch} resumed from different steps"
    return int(starts[0])


def assert_loss_goes_on(cluster: LocalCluster, wid: str, old: int, new: int) -> None:
    """The new epoch's first loss is near the old epoch's last (not back at the start), and
    keeps decreasing."""
    old_steps = [s for s in steps(cluster, wid, old) if s["rank"] == 0]
    new_steps = [s for s in steps(cluster, wid, new) if s["rank"] == 0]
    first = next(s for s in steps(cluster, wid) if s["rank"] == 0)["loss"]
    assert new_steps[0]["loss"] < first / 2, (first, new_steps[0])
    assert new_steps[0]["loss"] < old_steps[0]["loss"]
    assert new_steps[-1]["loss"] <= new_steps[0]["loss"] * 1.05


async def test_a_gang_starts_only_when_every_member_fits(
        local_cluster: ClusterFactory) -> None:
    cluster = await gang_cluster(local_cluster, nodes=2)
    wid = await cluster.submit(ddp_spec("big", nodes=3))
    snapshot = await cluster.wait_for(
        lambda s: "only 2 of 3 nodes" in workload_view(s, wid)["reason"], 20,
        what="pending with a reason")
    assert workload_view(snapshot, wid)["state"] == "pending"
    assert workload_view(snapshot, wid)["members"] == []
    for name in cluster.node_handles:  # no member holds a GPU anywhere
        assert all(g["allocated_to"] is None for g in node_view(snapshot, name)["gpus"])
    assert not (cluster.checkpoint_root / wid / "progress.jsonl").exists()


async def test_power_loss_of_a_member_node_resumes_the_gang_on_the_spare(
        local_cluster: ClusterFactory) -> None:
    cluster = await gang_cluster(local_cluster, nodes=3)
    wid = await cluster.submit(ddp_spec("ddp3", nodes=3))
    snapshot = before = await cluster.wait_for(training(wid), 90, what="gang training")
    epoch = workload_view(snapshot, wid)["epoch"]
    assert {n for _, n, _ in members(snapshot, wid)} == {"node-1", "node-2", "node-3"}
    await wait_steps(cluster, wid, epoch, 25)
    lost = members(snapshot, wid)[1][1]  # rank 1's node
    cluster.power_off(lost)
    snapshot = await cluster.wait_for(training(wid, epoch), 90, what="gang trains again")
    new = workload_view(snapshot, wid)
    ranks = members(snapshot, wid)
    assert ranks[1][1] == SPARE, ranks  # only the lost member moved, to the spare
    survivors = [(r, n) for r, n, _ in members(before, wid) if r != 1]
    assert [(r, n) for r, n, _ in ranks if r != 1] == survivors  # same nodes, same ranks
    await wait_steps(cluster, wid, new["epoch"], 10)
    resumed = resumed_from(cluster, wid, new["epoch"])
    assert resumed >= 20  # from the latest checkpoint, not from the start
    assert_loss_goes_on(cluster, wid, epoch, new["epoch"])
    assert new["restarts"] == 0  # a lost node is not the job's failure
    assert_never_two_copies(cluster, wid)


async def test_a_member_process_crash_restarts_the_gang_in_place(
        local_cluster: ClusterFactory) -> None:
    cluster = await gang_cluster(local_cluster, nodes=2)
    wid = await cluster.submit(ddp_spec("ddp2", nodes=2))
    snapshot = await cluster.wait_for(training(wid), 90, what="gang training")
    epoch = workload_view(snapshot, wid)["epoch"]
    before = members(snapshot, wid)
    await wait_steps(cluster, wid, epoch, 15)
    node = before[1][1]
    workers = [p for p in descendants(cluster.node_handles[node].agent_pid() or 0)
               if _is_worker(p)]
    assert workers, "the member's training process"
    os.kill(workers[0], signal.SIGKILL)
    snapshot = await cluster.wait_for(training(wid, epoch), 90, what="gang trains again")
    view = workload_view(snapshot, wid)
    assert [(r, n) for r, n, _ in members(snapshot, wid)] == [(r, n) for r, n, _ in before]
    assert view["restarts"] == 1
    await wait_steps(cluster, wid, view["epoch"], 5)
    assert resumed_from(cluster, wid, view["epoch"]) >= 10
    assert_loss_goes_on(cluster, wid, epoch, view["epoch"])
    assert_never_two_copies(cluster, wid)


def _is_worker(pid: int) -> bool:
    """A torchrun worker (runs ddp_train.py, its parent is torchrun)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        parent_cmd = Path(f"/proc/{parent}/cmdline").read_bytes()
    except (OSError, ValueError):
        return False
    return any(part.endswith(b"ddp_train.py") for part in cmdline) and b"torchrun" in parent_cmd


async def test_a_drain_of_a_member_node_loses_no_step(local_cluster: ClusterFactory) -> None:
    cluster = await gang_cluster(local_cluster, nodes=3)
    wid = await cluster.submit(ddp_spec("ddp-drain", nodes=2))
    snapshot = await cluster.wait_for(training(wid), 90, what="gang training")
    epoch = workload_view(snapshot, wid)["epoch"]
    await wait_steps(cluster, wid, epoch, 15)
    node = members(snapshot, wid)[1][1]
    refused = subprocess.run(  # a gang moves one member at a time: the CLI says so, exit 5
        [sys.executable, "-m", "hafo", "migrate", wid, "--etcd", cluster.etcd.endpoints[0],
         "--cluster", cluster.cluster], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 5, refused
    assert "a gang moves one member at a time" in refused.stderr
    moved = await intents.drain(cluster.store, cluster.keys, node)
    assert moved == [wid]
    snapshot = await cluster.wait_for(training(wid, epoch), 90, what="gang trains again")
    view = workload_view(snapshot, wid)
    assert node not in [n for _, n, _ in members(snapshot, wid)]
    await wait_steps(cluster, wid, view["epoch"], 5)
    last_old = max(s["step"] for s in steps(cluster, wid, epoch))
    assert resumed_from(cluster, wid, view["epoch"]) == last_old  # zero steps lost
    kinds = [e.kind for e in await read_events(cluster.store, cluster.keys, 0)
             if e.workload == wid]
    assert "checkpoint-requested" in kinds and "moved" in kinds
    assert view["restarts"] == 0
    assert_never_two_copies(cluster, wid)
