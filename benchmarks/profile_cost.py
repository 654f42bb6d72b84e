"""What a timing profile costs at rest: the CPU of an idle local cluster's agents, controllers
and etcd member over a minute, for the default profile (the baseline) and the fast one, in
the same run (docs/safety.md, "The fast profile").

    python benchmarks/profile_cost.py --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_main import run_main

from hafo.local.cluster import LocalCluster
from hafo.logs import configure

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of ``pid`` so far (0 if it is gone)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


async def measure(profile: str, seconds: float) -> dict[str, float]:
    """Share of a core per process of each kind, over ``seconds`` of an idle cluster."""
    cluster = LocalCluster(nodes=3, controllers=2, etcd_members=1, profile=profile)
    cluster.start()
    try:
        await cluster.wait_ready(60)
        await asyncio.sleep(5)
        pids = {"agent": [h.agent_pid() for h in cluster.node_handles.values()],
                "controller": [h.proc.pid if h.proc else None
                               for h in cluster.controller_handles.values()],
                "etcd": [m.proc.pid if m.proc else None for m in cluster.etcd.members]}
        before = {k: sum(cpu_seconds(p) for p in v) for k, v in pids.items()}
        started = time.monotonic()
        await asyncio.sleep(seconds)
        took = time.monotonic() - started
        after = {k: sum(cpu_seconds(p) for p in v) for k, v in pids.items()}
        await cluster.close_store()
        return {k: (after[k] - before[k]) / took / len(pids[k]) for k in pids}
    finally:
        cluster.stop()


async def main(seconds: float) -> int:
    base = await measure("default", seconds)
    fast = await measure("fast", seconds)
    print(f"idle cluster (3 agents, 2 controllers, 1 etcd member), {seconds:g} s each; "
          "share of one core per process:")
    print(f"{'':12s} {'default':>9s} {'fast':>9s} {'fast/default':>13s}")
    for kind in base:
        ratio = fast[kind] / base[kind] if base[kind] else float("nan")
        print(f"{kind:12s} {base[kind] * 100:8.2f}% {fast[kind] * 100:8.2f}% {ratio:12.1f}x")
    return 0


if __name__ == "__main__":
    configure("console", level="warning")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    if args.seconds <= 0:
        parser.error("--seconds: must be positive")
    run_main(lambda: asyncio.run(main(args.seconds)))
