"""``hafo demo``: an embedded cluster fails a checkpointing workload over after a power loss.

Starts etcd, 2 controllers and 3 agents with simulated GPUs, submits a workload that
checkpoints its progress, cuts the power of the node running it (every process of that node
at once), and prints the timeline: killed, detected, running again, steps lost.
"""

from __future__ import annotations

import asyncio
import time

from hafo.local.cluster import LocalCluster, demo_workload_spec
from hafo.local.progress import overlaps
from hafo.model.cluster import ClusterSnapshot
from hafo.model.views import workload_view
from hafo.store import read_events


def say(text: str) -> None:
    """Print a demo line at once."""
    print(text, flush=True)


async def _demo(cluster: LocalCluster) -> int:
    started = time.monotonic()
    say(f"hafo demo: etcd, 2 controllers, 3 agents with 4 simulated GPUs each (in {cluster.base})")
    cluster.start()
    snapshot = await cluster.wait_ready(60)
    say(f"  cluster ready in {time.monotonic() - started:.1f}s: leader {snapshot.leader}, "
        f"nodes {', '.join(sorted(snapshot.alive))}; lease TTL {cluster.lease_ttl}s")

    wid = await cluster.submit(demo_workload_spec(every=10))
    say(f"submitted {wid}: a training loop that checkpoints every 10 steps (1 GPU)")

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
    lines = cluster.progress_log(wid)
    last_before = max((ln.get("step", 0) for ln in lines if ln["epoch"] == old_epoch), default=0)
    resumed = next((ln for ln in lines if ln["epoch"] == view["epoch"]
                    and ln.get("event") == "start"), None)
    resumed_from = resumed["resumed_from"] if resumed else 0
    running_at = status.started_at if status and status.started_at else time.time()
    say("timeline:")
    say(f"  +0.00s  {victim} lost power (workload was at step {last_before})")
    if detected is not None:
        say(f"  +{detected.ts - killed_at:.2f}s  controller: {detected.message}")
    say(f"  +{running_at - killed_at:.2f}s  running again on {view['node']} "
        f"(epoch {view['epoch']}), resumed from checkpoint step {resumed_from}")
    found = overlaps(lines)
    lost = max(0, last_before - resumed_from)
    say(f"summary: recovered in {running_at - killed_at:.2f}s with a {cluster.lease_ttl}s lease "
        f"TTL; {lost} step(s) lost (checkpoint every 10); "
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
