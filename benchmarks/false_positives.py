"""No false positives under load: a quiet cluster must not fail anything over while both
cores are saturated by other processes and a neighbour hammers the disk with fsyncs.

    python benchmarks/false_positives.py --minutes 10
    python benchmarks/false_positives.py --minutes 10 --stall-every 60 --stall-for 2.5
    python benchmarks/false_positives.py --minutes 10 --profile fast

Counts, over the run, failovers, restarts, hang detections, re-registrations and epoch
changes (all spurious: nothing is injected but load). The quiet workloads report progress
every step (the SDK's heartbeat) and set ``hang_timeout`` (``--hang-timeout``, default 5 s),
and so does a real torchrun DDP gang of two members where torch is installed (``--ddp-gang``),
which also sets ``straggler_lag`` (``--straggler-lag``, default 0.5 s): a loaded machine must
not make them look hung, nor one member a straggler. The baseline is the same cluster, measured
first for a short while without the load. ``--stall-every S --stall-for T`` also freezes
every etcd member (SIGSTOP) for T seconds every S seconds under the load, as a GC pause or a
VM stall does: each stall expires every lease as etcd resumes, and the agents must hold
their nodes again (``node-resumed``, counted apart) without a restart (docs/safety.md, "An
etcd stall"). ``--profile fast`` runs the cluster in the fast timing profile (lease TTL 1 s,
etcd's election timeout 150 ms; ``hafo.model.timing_profile``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_main import run_main

from hafo.local.cluster import LocalCluster, demo_workload_spec
from hafo.local.stress import Stress
from hafo.logs import configure
from hafo.model.views import workload_view
from hafo.store import read_events


async def observe(cluster: LocalCluster, ids: list[str], seconds: float) -> dict[str, int]:
    """Count disruptive events and epoch changes over ``seconds``."""
    start = await cluster.snapshot()
    epochs = {w: workload_view(start, w)["epoch"] for w in ids}
    t0 = time.time()
    changed = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        snap = await cluster.snapshot()
        for w in ids:
            epoch = workload_view(snap, w)["epoch"]
            if epoch != epochs[w]:
                changed += 1
                epochs[w] = epoch
    events = [e for e in await read_events(cluster.store, cluster.keys, 0) if e.ts >= t0]
    count = {kind: sum(1 for e in events if e.kind == kind)
             for kind in ("failover", "restarted", "hung", "straggler", "node-reregistered",
                          "fenced",
                          "leader-elected", "node-resumed")}
    count["epoch changes"] = changed
    return count


async def stall_etcd(cluster: LocalCluster, every: float, stall: float,
                     done: list[float]) -> None:
    """Freeze every etcd member for ``stall`` seconds every ``every`` seconds."""
    members = list(range(len(cluster.etcd.members)))
    while True:
        await asyncio.sleep(every - stall)
        cluster.etcd.freeze(members)
        try:
            await asyncio.sleep(stall)
        finally:
            cluster.etcd.thaw(members)
        done.append(stall)


def ddp_gang_spec(hang_timeout: float, straggler_lag: float) -> dict[str, object]:
    """The DDP example (real torchrun, gloo on the CPU) as a 2-member gang with
    ``hang_timeout`` and ``straggler_lag``: its ranks report progress before each step's
    collectives and their own time per step after them."""
    root = Path(__file__).resolve().parent.parent
    return {"name": "quiet-ddp", "nodes": 2, "gpus": 0, "stop_grace": 15,
            "hang_timeout": hang_timeout, "straggler_lag": straggler_lag,
            "command": [str(Path(sys.executable).parent / "torchrun"),
                        str(root / "examples" / "ddp_train.py"), "--steps", "0",
                        "--every", "20", "--sleep", "0.05"],
            "env": {"HAFO_DDP_TIMEOUT": "120"}}


async def main(minutes: float, baseline: float, stall_every: float, stall_for: float,
               hang_timeout: float, ddp_gang: bool, straggler_lag: float, profile: str) -> int:
    cluster = LocalCluster(nodes=4, controllers=2, etcd_members=3, profile=profile)
    load = Stress(cluster.base / "etcd" / "stress")  # its fsyncs on etcd's disk
    cluster.start()
    try:
        await cluster.wait_ready(60)
        ids = [await cluster.submit({**demo_workload_spec(name=f"quiet-{i}", every=20),
                                     "hang_timeout": hang_timeout})
               for i in range(4)]
        if ddp_gang:
            ids.append(await cluster.submit(ddp_gang_spec(hang_timeout, straggler_lag)))
        await cluster.wait_for(lambda s: all(workload_view(s, w)["state"] == "running"
                                             for w in ids), 60)
        quiet = await observe(cluster, ids, baseline)
        print(f"baseline ({baseline:.0f}s, no load): {quiet}", flush=True)
        load.start()
        stalls: list[float] = []
        stalling = (asyncio.ensure_future(stall_etcd(cluster, stall_every, stall_for, stalls))
                    if stall_every > 0 else None)
        print(f"profile {profile} (lease TTL {cluster.lease_ttl}s, heartbeat "
              f"{cluster.heartbeat}s); load: {load.describe()} on etcd's disk, for "
              f"{minutes:g} min"
              + (f"; every etcd member frozen {stall_for:g} s every {stall_every:g} s"
                 if stalling else ""), flush=True)
        try:
            loaded = await observe(cluster, ids, minutes * 60)
        finally:
            if stalling is not None:
                stalling.cancel()
                await asyncio.gather(stalling, return_exceptions=True)
        print(f"under load ({minutes:g} min, {len(stalls)} etcd stalls): {loaded}")
        spurious = (loaded["failover"] + loaded["restarted"] + loaded["hung"]
                    + loaded["straggler"] + loaded["node-reregistered"] + loaded["fenced"])
        base = quiet["failover"] + quiet["restarted"] + quiet["hung"] + quiet["straggler"]
        print(f"spurious failovers/restarts/hangs/stragglers/re-registrations: {spurious} "
              f"(baseline {base})")
        await cluster.close_store()
        return 0 if spurious == 0 else 1
    finally:
        load.stop()
        cluster.stop()


if __name__ == "__main__":
    configure("console", level="warning")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--baseline", type=float, default=30.0, help="seconds without load")
    parser.add_argument("--stall-every", type=float, default=0.0,
                        help="freeze every etcd member every S seconds (0: never)")
    parser.add_argument("--stall-for", type=float, default=2.5, help="for T seconds")
    parser.add_argument("--hang-timeout", type=float, default=5.0,
                        help="the quiet workloads' hang_timeout (seconds, at least 1)")
    parser.add_argument("--ddp-gang", action=argparse.BooleanOptionalAction,
                        default=importlib.util.find_spec("torch") is not None,
                        help="also run examples/ddp_train.py as a 2-member gang (default: "
                             "where torch is installed)")
    parser.add_argument("--profile", choices=("default", "fast"), default="default",
                        help="the timing profile (hafo.model.timing_profile)")
    parser.add_argument("--straggler-lag", type=float, default=0.5,
                        help="the DDP gang's straggler_lag (seconds per step)")
    args = parser.parse_args()
    if args.hang_timeout < 1:
        parser.error("--hang-timeout: must be at least 1 (the spec's minimum)")
    if args.stall_every and not 0 < args.stall_for < args.stall_every:
        parser.error("--stall-for: must be positive and below --stall-every")
    run_main(lambda: asyncio.run(main(args.minutes, args.baseline, args.stall_every,
                                      args.stall_for, args.hang_timeout, args.ddp_gang,
                                      args.straggler_lag, args.profile)))
