"""``hafo demo``: an embedded cluster fails a checkpointing workload over after a power loss.

Starts etcd, 2 controllers and 3 agents with simulated GPUs, submits a workload that
checkpoints its progress, cuts the power of the node running it (every process of that node
at once), and prints the timeline: killed, detected, running again, steps lost.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from hafo.local.cluster import LocalCluster, demo_workload_spec
from hafo.local.progress import Resumption, overlaps, resumption
from hafo.model.cluster import ClusterSnapshot
from hafo.model.views import workload_view
from hafo.store import read_events

#: checkpoint interval of the demo workload, in steps
EVERY = 10
#: how long to wait for the new instance's first progress record after it runs
START_RECORD_WAIT = 10.0


def say(text: str) -> None:
    """Print a demo line at once."""
    print(text, flush=True)


def _known(value: int | None) -> str:
    return "unknown" if value is None else str(value)


async def _wait_for_start(cluster: LocalCluster, wid: str, new_epoch: int,
                          timeout: float) -> tuple[list[dict[str, Any]], Resumption]:
    """The progress log once the new epoch has written its ``start`` record (or ``timeout``
    passed), and what it says about the move from the epoch before."""
    deadline = time.monotonic() + timeout
    while True:
        lines = cluster.progress_log(wid)
        older = [int(ln["epoch"]) for ln in lines if int(ln["epoch"]) < new_epoch]
        moved_by = resumption(lines, max(older, default=new_epoch - 1), new_epoch)
        if moved_by.resumed_from is not None or time.monotonic() >= deadline:
            return lines, moved_by
        await asyncio.sleep(0.05)


async def _demo(cluster: LocalCluster) -> int:
    started = time.monotonic()
    say(f"hafo demo: etcd, 2 controllers, 3 agents with 4 simulated GPUs each (in {cluster.base})")
    cluster.start()
    snapshot = await cluster.wait_ready(60)
    say(f"  cluster ready in {time.monotonic() - started:.1f}s: leader {snapshot.leader}, "
        f"nodes {', '.join(sorted(snapshot.alive))}; lease TTL {cluster.lease_ttl}s")

    wid = await cluster.submit(demo_workload_spec(every=EVERY))
    say(f"submitted {wid}: a training loop that checkpoints every {EVERY} steps (1 GPU)")

    def running(s: ClusterSnapshot) -> bool:
        return bool(workload_view(s, wid)["state"] == "running")

    snapshot = await cluster.wait_for(running, 30, what="workload running")
    view = workload_view(snapshot, wid)
    victim, old_epoch = view["node"], view["epoch"]
    assert victim is not None  # running: it has a node
    say(f"  running on {victim} (epoch {old_epoch}, GPU {view['gpus'][0][:12]}...)")
    snapshot = await cluster.wait_for(
        lambda s: (workload_view(s, wid)["checkpoint"] or {}).get("step", 0) >= 30, 30,
        what="checkpoints")
    await asyncio.sleep(0.25)  # a few steps past the last checkpoint

    say(f"power loss: killing every process of {victim} at once (agent, guard, workload)")
    killed_at = time.time()
    pids = cluster.power_off(victim)
    say(f"  killed pids {pids}")

    def moved(s: ClusterSnapshot) -> bool:
        v = workload_view(s, wid)
        return v["state"] == "running" and v["node"] not in (None, victim)

    snapshot = await cluster.wait_for(moved, 30, what="failover")
    view = workload_view(snapshot, wid)
    status = snapshot.current_status(wid)
    events = await read_events(cluster.store, cluster.keys, 200)
    detected = next((e for e in events if e.kind == "failover" and e.workload == wid), None)
    # "running" is the guard's word; the workload says where it resumed once it has loaded its
    # checkpoint: wait (bounded) for that record rather than guess
    new_epoch = view["epoch"]
    assert new_epoch is not None  # running: it has an epoch
    lines, moved_by = await _wait_for_start(cluster, wid, new_epoch, START_RECORD_WAIT)
    running_at = status.started_at if status and status.started_at else time.time()
    say("timeline:")
    say(f"  +0.00s  {victim} lost power (workload was at step {_known(moved_by.last_step)})")
    if detected is not None:
        say(f"  +{detected.ts - killed_at:.2f}s  controller: {detected.message}")
    resumed = (f"resumed from checkpoint step {moved_by.resumed_from}"
               if moved_by.resumed_from is not None
               else f"resumed from an unknown step (the workload wrote no start record within "
                    f"{START_RECORD_WAIT:g}s)")
    say(f"  +{running_at - killed_at:.2f}s  running again on {view['node']} "
        f"(epoch {view['epoch']}), {resumed}")
    found = overlaps(lines)
    lost = moved_by.lost
    say(f"summary: recovered in {running_at - killed_at:.2f}s with a {cluster.lease_ttl}s lease "
        f"TTL; {_known(lost)} step(s) lost (checkpoint every {EVERY}); "
        + ("never two copies at once" if not found else f"OVERLAP: {found}"))
    await asyncio.sleep(1.0)
    final = workload_view(await cluster.snapshot(), wid)
    say(f"  {wid} now {final['state']} on {final['node']}, "
        f"checkpoint step {(final['checkpoint'] or {}).get('step')}")
    return 0 if not found else 1


def run_demo(keep: bool = False) -> int:
    """Run the demo; always tears the cluster down. Exit status 0 on a clean failover."""
    cluster = LocalCluster(keep=keep)

    async def main() -> int:
        try:
            return await _demo(cluster)
        finally:
            await cluster.close_store()

    try:
        return asyncio.run(main())
    except TimeoutError as exc:
        print(f"hafo demo: {exc}; logs in {cluster.base}/logs")
        cluster.keep = True
        return 1
    finally:
        cluster.stop()
        left = cluster.leftover_pids()
        say("cleaned up: all processes stopped" if not left else f"still running: {left}")
