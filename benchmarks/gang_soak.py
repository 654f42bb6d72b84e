"""A gang that loses a node every minute, for minutes: how much of the time does it train?

The effective training time ratio (torchft's figure: 81.2% with a failure every 60 s) is
useful steps x step time / wall: the steps the job's counter advanced over the window (a
failure's lost steps are done again, so they do not count), times the step time of the same
job training undisturbed (the median interval between one process's consecutive steps, in
this run), over the window's wall time. Side by side, on this machine:

- **hafo warm**: a local cluster of 4 nodes at TTL 3 s, one kept idle as a spare
  (``placement.spares: 1``), the 3-node gang of ``examples/warm_train.py`` with ``warm: true``
  (survivors kept, a standby on the spare, snapshots every step). Every ``--every`` seconds
  the node of a member (rank 1's) loses power; it comes back 10 s later, idle, and becomes
  the next spare, where the gang's next standby waits.
- **torchrun**: ``benchmarks/gang_baseline.py``'s three elastic torchrun "nodes"
  (``--nnodes 2:3``, c10d rendezvous on node 1, ``--max-restarts`` 1000 so that it never gives
  up for counting), the DDP example checkpointing every 10 steps. Every ``--every`` seconds a
  node that is not the rendezvous host loses power (its tree SIGKILLed) and comes back 10 s
  later (its torchrun started again).

    python benchmarks/gang_failover.py --soak 10 [--every-s 60]
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gang_baseline import ROOT, SCRIPT, TORCHRUN, TorchrunGang

from hafo.local.cluster import LocalCluster
from hafo.local.procs import spawn
from hafo.local.progress import overlaps
from hafo.model.views import workload_view

BACK_AFTER = 10.0  # a powered-off node comes back after this long
WARMUP_STEPS = 25


def step_time(lines: list[dict[str, Any]]) -> float:
    """The median interval between one process's consecutive steps, within one epoch (the
    job training undisturbed)."""
    last: dict[tuple[Any, ...], tuple[int, float]] = {}
    gaps: list[float] = []
    for line in sorted((x for x in lines if x.get("event") == "step"
                        and x.get("rank", 0) == 0), key=lambda x: x["t"]):
        key = (line.get("node"), line.get("pid"), line.get("epoch"))
        previous = last.get(key)
        if previous is not None and line["step"] == previous[0] + 1:
            gaps.append(line["t"] - previous[1])
        last[key] = (line["step"], line["t"])
    if not gaps:
        raise RuntimeError("no two consecutive steps to time")
    return statistics.median(gaps)


def ratio(lines: list[dict[str, Any]], start: float, end: float) -> dict[str, float]:
    """The effective training time ratio over [start, end] (wall clock), from the job's
    progress log."""
    steps = [x for x in lines if x.get("event") == "step" and x.get("rank", 0) == 0]
    before = max((x["step"] for x in steps if x["t"] <= start), default=0)
    during = [x for x in steps if start < x["t"] <= end]
    reached = during[-1]["step"] if during else before
    useful = reached - before
    pace = step_time(lines)
    return {"ratio": useful * pace / (end - start), "useful_steps": float(useful),
            "step_time": pace, "wall": end - start}


async def soak_hafo(minutes: float, every: float, ttl: int = 3,
                    say: Callable[[str], Any] = print) -> dict[str, float]:
    """The warm gang, a member's node powered off every ``every`` seconds."""
    cluster = LocalCluster(nodes=4, controllers=1, gpus_per_node=1, lease_ttl=ttl,
                           controller_config={"placement": {"spares": 1}})
    try:
        cluster.start()
        await cluster.wait_ready(60)
        wid = await cluster.submit({
            "name": "soak-warm", "nodes": 3, "gpus": 1, "stop_grace": 15, "warm": True,
            "command": [sys.executable, str(ROOT / "examples" / "warm_train.py"), "--steps", "0",
                        "--every", "10", "--sleep", "0.05"],
            "env": {"HAFO_DDP_TIMEOUT": "15"}})

        def rank0_steps() -> int:
            return sum(1 for x in cluster.progress_log(wid)
                       if x.get("event") == "step" and x.get("rank") == 0)

        await cluster.wait_for(lambda s: rank0_steps() >= WARMUP_STEPS, 180,
                               what="the gang training")
        start = time.time()
        end = start + minutes * 60
        cuts = 0
        while time.time() + every <= end + 1e-6:
            await asyncio.sleep(every - BACK_AFTER)
            view = workload_view(await cluster.snapshot(), wid)
            victim = view["members"][1]["node"]
            cluster.power_off(victim)
            cuts += 1
            await asyncio.sleep(BACK_AFTER)
            cluster.start_node(victim)
            say(f"hafo warm: power cut {cuts} ({victim}), {time.time() - start:.0f}s in")
        await asyncio.sleep(max(0.0, end - time.time()))
        lines = cluster.progress_log(wid)
        found = overlaps(lines)
        if found:
            raise AssertionError(f"two epochs of the gang alive at once: {found}")
        result = ratio(lines, start, end)
        result["cuts"] = float(cuts)
        result["warm_starts"] = float(sum(1 for x in lines if x.get("event") == "start"
                                          and x.get("warm") and start < x["t"] <= end))
        return result
    finally:
        await cluster.close_store()
        cluster.stop()


def soak_torchrun(minutes: float, every: float, base: Path,
                  say: Callable[[str], Any] = print) -> dict[str, float]:
    """Plain elastic torchrun, a worker node powered off every ``every`` seconds."""
    gang = SoakingTorchrun(base)
    try:
        gang.start()
        deadline = time.monotonic() + 180
        while sum(1 for x in gang.progress() if x.get("event") == "step"
                  and x.get("rank") == 0) < WARMUP_STEPS:
            if time.monotonic() > deadline:
                raise TimeoutError("the torchrun gang did not train within 180 s")
            time.sleep(0.1)
        start = time.time()
        end = start + minutes * 60
        cuts = 0
        while time.time() + every <= end + 1e-6:
            time.sleep(every - BACK_AFTER)
            victim = 1 + cuts % 2  # never the rendezvous host (it would end the job)
            gang.power_off(victim)
            cuts += 1
            time.sleep(BACK_AFTER)
            gang.restart(victim)
            say(f"torchrun: power cut {cuts} (n{victim + 1}), {time.time() - start:.0f}s in")
        time.sleep(max(0.0, end - time.time()))
        result = ratio(gang.progress(), start, end)
        result["cuts"] = float(cuts)
        return result
    finally:
        gang.stop()


class SoakingTorchrun(TorchrunGang):
    """The baseline's torchrun gang, restarting without limit, whose nodes come back."""

    def argv(self, node: int) -> list[str]:
        """Node ``node``'s torchrun command."""
        return [TORCHRUN, "--nnodes", "2:3", "--nproc-per-node", "1", "--max-restarts", "1000",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
                "--rdzv-id", self.run_id,
                "--rdzv-conf", f"is_host={'true' if node == 0 else 'false'}",
                "--local-addr", "127.0.0.1",
                SCRIPT, "--steps", "0", "--every", "10", "--sleep", "0.05"]

    def start(self) -> None:
        """Launch the three nodes, the rendezvous host first."""
        self.procs = [self._spawn(node) for node in range(3)]

    def restart(self, node: int) -> None:
        """The node is back: its torchrun starts again and joins the next round."""
        self.procs[node] = self._spawn(node)

    def _spawn(self, node: int) -> subprocess.Popen[bytes]:
        return spawn(self.argv(node), self.base / "logs" / f"n{node + 1}.log",
                     env=self.env(node), cwd=str(ROOT))
